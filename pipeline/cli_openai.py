"""`trtllm-pipeline openai CONFIG`: the OpenAI-compatible front end (clients.openai_server) in front of Triton.

Part of the CLI (the composition root, which may import `clients`). Which Triton it talks to:
`--triton-url` if given (the model's facts, i.e. gather flags, limits and the preprocessing
parameters, are then read from that Triton's model-configuration API, and a URL where no Triton
serves the model is an error at start); else the server `serve CONFIG --detach` started, if it runs; else it
builds what is missing and starts tritonserver itself the way `serve` does, and stops it on exit.
CONFIG may also be a rendered model repository (e.g. /models in the compose deployment), which
then needs `--triton-url` and is read for the facts (deployments mount the repository their
Triton serves; the front end may start before that Triton is up, so it does not ask it for them). The model name clients pass is the
spec's `name` (`--model-name` overrides it; for a repository it defaults to the Triton model's name, `--triton-model`).
The Triton model it calls, unless `--triton-model` names one (the deployments' commands do): the ensemble
(pipeline.serve.front_end_route says why not the BLS).

API keys (clients.api_keys, clients.openai_server.access) come from `--api-key-file` or the TRTLLM_PIPELINE_API_KEYS
variable, never from the command line (where `ps` shows them); they are read first, so a bad key file stops the
command before anything is built or started.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError, SpecError


def add_openai_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from clients.openai_server.defaults import DEFAULT_HOST, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JSON_DEPTH, DEFAULT_MAX_N, DEFAULT_PORT

    parser.add_argument("config", type=Path, help="build config YAML (or a rendered model repository, with --triton-url)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE", help="override a config field (repeatable)")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT}; 0: a free one)")
    parser.add_argument(
        "--triton-url",
        help=(
            "Triton's gRPC host:port, asked for the model's facts (gather flags, limits) at start "
            "(default: the `serve --detach` server, else one started here); with a repository CONFIG the facts come from the repository"
        ),
    )
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help=f"larger request bodies get 413 (default {DEFAULT_MAX_BODY_BYTES})")
    parser.add_argument(
        "--max-json-depth",
        type=int,
        default=DEFAULT_MAX_JSON_DEPTH,
        help=f"request bodies whose arrays/objects nest deeper get 400 (default {DEFAULT_MAX_JSON_DEPTH})",
    )
    parser.add_argument("--max-n", type=int, default=DEFAULT_MAX_N, help=f"most choices (n x prompts) per request (default {DEFAULT_MAX_N})")
    parser.add_argument("--model-name", help="the name clients pass as `model` (default: the build config's name)")
    parser.add_argument(
        "--lora",
        dest="lora_modules",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help=(
            "serve a LoRA adapter as model NAME (repeatable; listed by /v1/models, as vLLM's --lora-modules): a PEFT adapter "
            "directory, or one `trtllm-pipeline lora convert` wrote; sent to Triton with the first request that names it"
        ),
    )
    parser.add_argument(
        "--triton-model",
        help=(
            "the Triton model to call (default: tensorrt_llm_bls on a Triton older than 2.57, such as the bundled 2.51; "
            "else the ensemble: the build config's serve.model_name, `ensemble` for a repository)"
        ),
    )
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for a tritonserver started here (default 180)")
    keys = parser.add_argument_group("API keys (docs/api-keys.md)")
    keys.add_argument(
        "--api-key-file",
        type=Path,
        metavar="FILE",
        help=(
            "clients must send one of these keys (Authorization: Bearer KEY) on /v1/*: KEY or NAME:KEY per line; "
            "or set TRTLLM_PIPELINE_API_KEYS (same syntax, comma-separated). Default: no keys, everyone is served"
        ),
    )
    keys.add_argument(
        "--max-concurrent-per-key",
        type=int,
        metavar="N",
        help="generation requests one key may have in flight; more get 429 with Retry-After (default: no limit)",
    )
    keys.add_argument("--metrics-need-key", action="store_true", help="/metrics asks for a key too (default: open, for the private scrape network)")
    return parser


def access_policy(args: argparse.Namespace) -> Any:
    """The front end's AccessPolicy from --api-key-file / TRTLLM_PIPELINE_API_KEYS and the limits; errors name the line, never a key."""
    from clients.api_keys import ApiKeyError, configured_api_keys
    from clients.openai_server.access import AccessPolicy, KeyRing

    try:
        keys = configured_api_keys(args.api_key_file)
        return AccessPolicy(
            KeyRing(keys) if keys is not None else None,
            max_concurrent_per_key=args.max_concurrent_per_key,
            metrics_need_key=args.metrics_need_key,
        )
    except ApiKeyError as error:
        raise SpecError(str(error), hint="one key per line, KEY or NAME:KEY, keys of at least 16 characters (docs/api-keys.md)") from None
    except ValueError as error:
        raise SpecError(str(error)) from None


def lora_adapters(modules: list[str]) -> dict[str, Any]:
    """--lora NAME=DIR options → {NAME: LoraAdapter}; a malformed option, a repeated name or an unreadable adapter: SpecError naming it."""
    from clients.errors import ClientError
    from clients.lora import LoraAdapter

    adapters: dict[str, Any] = {}
    for option in modules:
        name, sep, directory = option.partition("=")
        if not sep or not name or not directory:
            raise SpecError(f"--lora {option!r}: expected NAME=DIR (the model name clients pass, and the adapter's directory)")
        if name in adapters:
            raise SpecError(f"--lora {option!r}: the name {name!r} is given twice")
        try:
            adapters[name] = LoraAdapter.from_dir(Path(directory))
        except ClientError as error:
            raise SpecError(f"--lora {option!r}: {error}") from None
    return adapters


def run_openai(args: argparse.Namespace, *, say: Callable[[str], None], build_package: Callable[[Any, Any], Path], state_dir: Callable[[Any], Path]) -> int:
    """`build_package(loaded, store)` → the packaged repository (cpu target); `state_dir(store)` → where `serve --detach` records its server."""
    from clients.openai_server import ModelSetupError, ServedModel
    from clients.openai_server.traffic import TrafficTableError

    options = {
        "host": args.host,
        "port": args.port,
        "max_body_bytes": args.max_body_bytes,
        "max_json_depth": args.max_json_depth,
        "max_n": args.max_n,
        "access": access_policy(args),
        "adapters": lora_adapters(args.lora_modules),
    }
    try:
        if args.config.is_dir():
            if not args.triton_url:
                raise SpecError(f"{args.config} is a model repository: give the Triton it is served by with --triton-url HOST:PORT")
            triton_model = _triton_model(args, "ensemble")
            model = ServedModel.from_repository(args.config, name=args.model_name or triton_model, triton_model=triton_model)
            return _serve(args.triton_url, model, options, say)
        return _serve_config(args, options, say, build_package, state_dir)
    except TrafficTableError as error:
        raise SpecError(str(error), hint="serve.traffic.keys names API keys by the NAME of NAME:KEY (docs/traffic-classes.md)") from None
    except ModelSetupError as error:
        hint = (
            "check --triton-url (Triton's gRPC port) and --triton-model"
            if args.triton_url and not args.config.is_dir()
            else "check the model repository / tokenizer the server reads"
        )
        raise PipelineError(str(error), hint=hint) from None
    except OSError as error:
        raise PipelineError(str(error), hint="choose another --port (or --host)") from None


def _serve_config(args, options, say, build_package, state_dir) -> int:
    from clients.openai_server import ServedModel
    from pipeline.artifacts import ArtifactStore, store_root
    from pipeline.backends.registry import backend_for
    from pipeline.config.loader import load_config
    from pipeline.serve import ServerOptions, TritonServer, read_state

    loaded = load_config(args.config, args.overrides)
    spec = loaded.spec
    name = args.model_name or spec.name
    store = ArtifactStore(store_root(args.artifacts, writable=True), spec.name)
    if args.triton_url:  # anywhere (e.g. a GPU host): the facts come from that Triton, nothing is built
        triton_model = _triton_model(args, spec.serve.model_name)
        model = ServedModel.from_triton(args.triton_url, name=name, triton_model=triton_model)
        if not model.tokenizer_dir.is_dir():
            # The preprocessing's tokenizer_dir is a path on the Triton host (e.g. /models/... in a
            # container); here the spec's checkpoint (which holds the same tokenizer files) is read instead.
            model = dataclasses.replace(model, tokenizer_dir=Path(spec.model.source))
        return _serve(args.triton_url, model, options, say)
    state = read_state(state_dir(store))
    if state is not None and state.is_running():
        say(f"using the tritonserver started with `serve --detach` (pid {state.pid}, gRPC {state.grpc_url})")
        triton_model = _triton_model(args, spec.serve.model_name)
        model = ServedModel.from_repository(state.model_repository, name=name, triton_model=triton_model)
        return _serve(state.grpc_url, model, options, say)
    if not backend_for(spec.build.target).serves_here:
        raise SpecError(
            f"{loaded.path} has build.target {spec.build.target.value!r}: its Triton runs elsewhere (a GPU host or the compose deployment)",
            hint="give it with --triton-url HOST:PORT (its gRPC port)",
        )
    repository = build_package(loaded, store)
    server_options = ServerOptions.from_deploy(spec.deploy, repository)
    with TritonServer(server_options) as triton:
        say(f"starting tritonserver on {server_options.grpc_url} ...")
        triton.wait_until_ready(args.timeout)
        triton_model = _triton_model(args, spec.serve.model_name)
        model = ServedModel.from_repository(repository, name=name, triton_model=triton_model)
        code = _serve(server_options.grpc_url, model, options, say, keep_running=triton.is_running)
        if not triton.is_running():
            raise PipelineError(f"tritonserver exited on its own; see {triton.log_path}\n{triton.log_tail()}")
        say("stopping tritonserver ...")
        return code


def _triton_model(args: argparse.Namespace, ensemble: str) -> str:
    """`--triton-model`, else the default route (pipeline.serve.front_end_route)."""
    from pipeline.serve.front_end_route import front_end_triton_model

    return args.triton_model or front_end_triton_model(ensemble)


def _serve(triton_url: str, model, options: dict, say: Callable[[str], None], keep_running: Callable[[], bool] = lambda: True) -> int:
    from clients.openai_server import serve_openai

    if model.name in options["adapters"]:
        raise SpecError(f"--lora {model.name}=...: {model.name!r} is the served model's name; give the adapter another name")

    def ready(base_url: str) -> None:
        say(f"OpenAI-compatible API for model {model.name!r} (Triton {triton_url}, model {model.triton_model!r}):")
        say(options["access"].describe())
        if options["adapters"]:
            say(f"LoRA adapters (model names): {', '.join(options['adapters'])}")
        say(base_url)  # alone on its line, for scripts
        say("Press Ctrl-C to stop.")

    return serve_openai(triton_url, model=model, on_ready=ready, keep_running=keep_running, **options)
