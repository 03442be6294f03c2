"""`trtllm-pipeline infer "prompt"`: one request to a running server (Triton over gRPC or HTTP, or the OpenAI API:
clients.openai_infer), the answer on stdout.

`add_infer_arguments(parser)` + `run_infer(args)` plug into the pipeline's CLI; `infer_main(argv)`
runs on its own. Client errors are reported in one line on stderr with exit code 1; Ctrl-C
during a stream cancels the request (gRPC: on the server too) and is re-raised.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from clients.defaults import DEFAULT_OPENAI_URL, DEFAULT_TIMEOUT_S, DEFAULT_URLS
from clients.errors import ClientError, ServerUnavailableError

if TYPE_CHECKING:  # imported where used: the parser must not load numpy and safetensors reading
    from clients.lora import LoraAdapter


def add_infer_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("prompt", help="text to continue")
    parser.add_argument(
        "--url", help=(f"server address (default: {DEFAULT_URLS['grpc']} for grpc, {DEFAULT_URLS['http']} for http, {DEFAULT_OPENAI_URL} for openai)")
    )
    parser.add_argument("--protocol", choices=["grpc", "http", "openai"], default="grpc", help="default grpc; openai: /v1/completions")
    parser.add_argument(
        "--model",
        help=("model to call (default ensemble; tensorrt_llm_bls has the same contract); over openai the served name (default: the one /v1/models lists)"),
    )
    parser.add_argument(
        "--api-key-file",
        type=Path,
        metavar="FILE",
        help=("with --protocol openai: send the first key of FILE as Authorization: Bearer (default: of TRTLLM_PIPELINE_API_KEYS, if set)"),
    )
    parser.add_argument("--stream", action="store_true", help="print the text as it is generated")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default 64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; sampling needs --top-k or --top-p too (default 0: greedy)")
    parser.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens")
    parser.add_argument("--top-p", type=float, default=None, help="sample from the smallest set of tokens with this probability mass")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    parser.add_argument("--beam-width", type=int, default=None, metavar="B", help="beam search with B beams: prints every beam, best first (not with --stream)")
    parser.add_argument("--stop", action="append", default=None, metavar="WORD", help="stop at this word or phrase (repeatable)")
    parser.add_argument(
        "--priority",
        type=float,
        default=None,
        metavar="P",
        help="the request's priority in [0, 1], higher first (grpc/http to a cpu-target repository; docs/traffic-classes.md)",
    )
    parser.add_argument("--service-tier", default=None, metavar="CLASS", help="--protocol openai: OpenAI's service_tier, a traffic class or a tier it lists")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help=f"seconds for the whole request (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--retries", type=int, default=2, help="retries while the server cannot be reached (default 2)")
    parser.add_argument(
        "--lora-dir",
        type=Path,
        metavar="DIR",
        default=None,
        help=(
            "send this LoRA adapter with the request (a PEFT adapter directory, or model.lora_weights.npy + model.lora_config.npy "
            "as `trtllm-pipeline lora convert` writes them): its weights and config with --lora-task-id, as NVIDIA's client does"
        ),
    )
    parser.add_argument(
        "--lora-task-id",
        type=int,
        metavar="N",
        default=None,
        help=(
            "the adapter's task id; alone (without --lora-dir), the server's cached adapter N (sent before, or prefetched). "
            "Default with --lora-dir: one derived from the adapter's tensors"
        ),
    )
    parser.add_argument("--json", action="store_true", help='print {"prompt", "text", "latency_s", "protocol"} as JSON')
    guide = parser.add_mutually_exclusive_group()
    guide.add_argument("--json-schema", metavar="FILE", default=None, help="guided decoding: the answer is JSON valid against this JSON schema file")
    guide.add_argument("--regex", metavar="PATTERN", default=None, help="guided decoding: the answer matches this regular expression")
    guide.add_argument("--grammar", metavar="FILE", default=None, help="guided decoding: the answer follows this EBNF grammar file (xgrammar's GBNF)")
    return parser


def guide_options(args: argparse.Namespace) -> dict[str, str]:
    """The guided_decoding_* request fields of --json-schema / --regex / --grammar (OSError: a file is unreadable)."""
    if args.json_schema is not None:
        with open(args.json_schema, encoding="utf-8") as schema:
            return {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": schema.read()}
    if args.regex is not None:
        return {"guided_decoding_guide_type": "regex", "guided_decoding_guide": args.regex}
    if args.grammar is not None:
        with open(args.grammar, encoding="utf-8") as grammar:
            return {"guided_decoding_guide_type": "ebnf_grammar", "guided_decoding_guide": grammar.read()}
    return {}


def run_infer(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from clients.client import TritonLLMClient  # here: the parser above is built by `validate` too

    out = out or sys.stdout
    err = err or sys.stderr
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed, "stop": args.stop}
    if args.beam_width is not None:
        sampling["beam_width"] = args.beam_width
    try:
        sampling.update(guide_options(args))
    except OSError as error:
        err.write(f"error: cannot read the guide: {error}\n")
        return 1
    if args.protocol == "openai":
        if args.priority is not None:
            err.write("error: --priority is a Triton input; over --protocol openai a class is asked for with --service-tier\n")
            return 1
        sampling["service_tier"] = args.service_tier
        if args.lora_dir is not None or args.lora_task_id is not None:
            err.write(
                "error: --lora-dir / --lora-task-id are Triton inputs; over --protocol openai an adapter is chosen by "
                "--model NAME (the front end's --lora NAME=DIR)\n"
            )
            return 1
        return _infer_openai(args, sampling, out, err)
    if args.service_tier is not None:
        err.write("error: --service-tier is an OpenAI field (--protocol openai); to Triton send --priority P in [0, 1]\n")
        return 1
    if args.priority is not None:
        sampling["priority"] = args.priority
    try:
        lora = _lora_adapter(args)
        if lora is not None:
            sampling["lora"] = lora
        with TritonLLMClient(args.url, args.protocol, args.model or "ensemble", timeout=args.timeout, retries=args.retries) as client:
            if args.stream:
                with client.stream(args.prompt, max_tokens=args.max_tokens, **sampling) as stream:
                    for delta in stream:
                        if not args.json:
                            out.write(delta)
                            out.flush()
                    completion = stream.completion
                if not args.json:
                    out.write("\n")
            else:
                completion = client.generate(args.prompt, max_tokens=args.max_tokens, **sampling)
                if not args.json and completion.beams:
                    out.write("".join(f"[beam {index}] {text}\n" for index, text in enumerate(completion.beams)))
                elif not args.json:
                    out.write(completion.text + "\n")
            if args.json and completion is not None:
                _write_record(args, out, completion.text, completion.latency_s, beams=completion.beams)
            out.flush()
    except ServerUnavailableError as error:
        err.write(f"error: {error}\nhint: is the server running? `trtllm-pipeline serve CONFIG` starts one (check --url / --protocol)\n")
        return 1
    except ClientError as error:
        err.write(f"error: {error}\n")
        return 1
    return 0


def _lora_adapter(args: argparse.Namespace) -> LoraAdapter | None:
    """--lora-dir / --lora-task-id as a LoraAdapter (None without either)."""
    from clients.lora import LoraAdapter

    if args.lora_dir is not None:
        return LoraAdapter.from_dir(args.lora_dir, args.lora_task_id)
    return None if args.lora_task_id is None else LoraAdapter(args.lora_task_id)


def _write_record(args: argparse.Namespace, out: TextIO, text: str, latency_s: float, *, beams: tuple[str, ...] = ()) -> None:
    record = {"prompt": args.prompt, "text": text, "latency_s": round(latency_s, 6), "protocol": args.protocol}
    if beams:
        record["beams"] = list(beams)
    out.write(json.dumps(record, ensure_ascii=False) + "\n")


def _infer_openai(args: argparse.Namespace, sampling: dict[str, Any], out: TextIO, err: TextIO) -> int:
    from clients.api_keys import ApiKeyError, given_api_keys
    from clients.openai_infer import complete

    try:
        keys = given_api_keys(args.api_key_file)
    except ApiKeyError as error:
        err.write(f"error: {error}\n")
        return 1

    def show(text: str) -> None:
        if not args.json:
            out.write(text)
            out.flush()

    try:
        completion = complete(
            args.url or DEFAULT_OPENAI_URL,
            args.prompt,
            model=args.model,
            api_key=keys[0].secret if keys else None,
            max_tokens=args.max_tokens,
            sampling=sampling,
            stream=args.stream,
            timeout=args.timeout,
            on_text=show,
        )
    except ServerUnavailableError as error:
        err.write(f"error: cannot reach {error.url}: {error.reason}\n")
        err.write("hint: is the OpenAI front end running? `trtllm-pipeline openai CONFIG` starts one (check --url)\n")
        return 1
    except ClientError as error:
        err.write(f"error: {error}\n")
        return 1
    if args.json:
        _write_record(args, out, completion.text, completion.latency_s)
    else:
        out.write(("" if args.stream else completion.text) + "\n")
    out.flush()
    return 0


def infer_main(argv: list[str] | None = None) -> int:
    parser = add_infer_arguments(argparse.ArgumentParser(prog="trtllm-pipeline infer", description="send one prompt to a running server"))
    args = parser.parse_args(argv)
    try:
        return run_infer(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(infer_main())
