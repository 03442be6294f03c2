"""Command line. `run_cli(argv)` raises; `main()` is the one error boundary that turns errors into exit codes."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pipeline.artifacts import ArtifactStore, differences, read_manifest, store_root
from pipeline.backends.registry import backend_for
from pipeline.cli_capacity import print_capacity
from pipeline.config.loader import LoadedConfig, format_issues, load_config
from pipeline.config.prequantized_targets import quantization_summary
from pipeline.config.reference import config_reference_markdown
from pipeline.config.schema import spec_schema_text
from pipeline.errors import ArtifactError, PipelineError, SpecError
from pipeline.hashing import file_hashes
from pipeline.plan import Plan
from pipeline.preflight import target_issues
from pipeline.runner import StageResult, artifact_state, check_runnable, make_plan, run_pipeline
from pipeline.speculative.summary import speculative_summary

DEFAULT_ARTIFACTS = "artifacts"
SCHEMA_PATH = Path("build_configs/schema.json")


Handler = Callable[[argparse.Namespace, Console], int]
ConfigHandler = Callable[[LoadedConfig, ArtifactStore, argparse.Namespace, Console], int]


def _parser() -> argparse.ArgumentParser:
    """Every subcommand names its handler (`args.handler`); the config commands' handlers get the loaded
    config and its artifact store (read-only for the commands that only look)."""
    parser = argparse.ArgumentParser(
        prog="trtllm-pipeline",
        description="Build config (YAML) → quantized checkpoint → engine → Triton model repository → deployment.",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="show tracebacks of errors")
    parser.add_argument(
        "--artifacts",
        type=Path,
        default=Path(os.environ.get("TRTLLM_PIPELINE_ARTIFACTS", DEFAULT_ARTIFACTS)),
        help="artifact store root (default: $TRTLLM_PIPELINE_ARTIFACTS or ./artifacts)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(name: str, help_text: str, handler: ConfigHandler, *, writes: bool = True) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.add_argument("config", type=Path, help="build config YAML, e.g. build_configs/tiny-cpu.yaml")
        command.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE", help="override a config field (repeatable)")
        command.set_defaults(handler=_with_config(handler, writes=writes))
        return command

    with_config("validate", "check a build config (and the model it points at) without running anything", _validate, writes=False)
    plan = with_config("plan", "show the stages, their digests and which are cached", _plan, writes=False)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument("--gpu", choices=["H100-80GB", "H200", "L40S", "A100-80GB", "B200"], help="also plan GPU memory: weights, KV cache capacity, batch size")
    plan.add_argument("--tp", type=int, help="tensor-parallel size for --gpu (default: build.tp_size)")
    run = with_config("run", "run the pipeline, reusing cached stages", _run)
    run.add_argument("--until", metavar="STAGE", help="stop after this stage")
    run.add_argument("--force", action="store_true", help="rebuild the selected stages even if cached")
    run.add_argument("--runner", choices=["local", "docker", "dry-run"], help="where trtllm-build runs (engine target); same as --set build.runner=...")
    with_config("status", "show which artifacts of a build config exist", _status, writes=False)
    with_config("verify", "re-read every file of every artifact of a build config and report what differs from its manifest", _verify, writes=False)
    generate = with_config("generate", "run the built cpu engine in-process on one prompt (builds what is missing first)", _generate)
    generate.add_argument("--prompt", required=True, help="text to continue")
    generate.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default 64)")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    generate.add_argument("--seed", type=int, default=None, help="sampling seed")
    generate.add_argument("--json", action="store_true", help="print prompt and output token ids and text as JSON")
    serve = with_config("serve", "build what is missing, then serve the cpu target with the bundled tritonserver until Ctrl-C", _serve)
    serve.add_argument("--detach", action="store_true", help="start in the background and return once every model is ready; end it with `stop`")
    serve.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness (default 180)")
    with_config("stop", "stop a server started with `serve --detach`; after a crash, end the stubs it left and say so", _stop, writes=False)
    deploy = with_config("deploy", "render the deployment of deploy.kind (compose, or kubernetes manifests) and export it", _deploy)
    deploy.add_argument("--out", type=Path, default=Path("deploy"), help="where to export the deployment (default ./deploy)")
    deploy.add_argument("--up", action="store_true", help="then start it: `docker compose up -d` (compose), `kubectl apply -k` (kubernetes)")
    deploy.add_argument("--service", dest="services", action="append", default=[], metavar="NAME", help="with --up: start only this service (repeatable)")
    deploy.add_argument(
        "--file",
        dest="extra_files",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="with --up: a compose override file merged after the rendered one (repeatable)",
    )
    # The CLI is the composition root: `infer` is the clients package's own command, mounted here.
    from clients.cli import add_infer_arguments

    infer = sub.add_parser("infer", help="send one prompt to a running server (HTTP or gRPC, optionally streamed)")
    add_infer_arguments(infer).set_defaults(handler=_infer)
    from clients.lora_cli import add_lora_arguments

    lora = sub.add_parser("lora", help="LoRA adapters: convert a PEFT adapter into NVIDIA's lora_weights / lora_config tensors")
    add_lora_arguments(lora).set_defaults(handler=_lora)
    from pipeline.cli_openai import add_openai_arguments

    openai = sub.add_parser("openai", help="serve the OpenAI-compatible API (/v1/completions, /v1/chat/completions) in front of Triton")
    add_openai_arguments(openai).set_defaults(handler=_openai)
    from bench.commands import add_bench_parser

    add_bench_parser(sub, handler=_bench)
    schema = sub.add_parser("schema", help="print the JSON Schema of build configs")
    schema.add_argument("--write", action="store_true", help=f"write it to {SCHEMA_PATH}")
    schema.add_argument("--markdown", action="store_true", help="print the field reference (docs/reference.md) instead")
    schema.set_defaults(handler=_schema)
    return parser


def run_cli(argv: list[str], console: Console) -> int:
    args = _parser().parse_args(argv)
    return args.handler(args, console)


def _with_config(handler: ConfigHandler, *, writes: bool) -> Handler:
    def load_then_handle(args: argparse.Namespace, console: Console) -> int:
        overrides = list(args.overrides)
        if getattr(args, "runner", None):
            overrides.append(f"build.runner={args.runner}")
        loaded = load_config(args.config, overrides)
        issues = target_issues(loaded.spec, loaded.model)  # the build target's own rules (validate reports them too)
        if issues:
            raise SpecError(format_issues(issues, loaded.source_map))
        store = ArtifactStore(store_root(args.artifacts, writable=writes), loaded.spec.name)
        return handler(loaded, store, args, console)

    return load_then_handle


def _infer(args: argparse.Namespace, console: Console) -> int:
    from clients.cli import run_infer

    return run_infer(args)


def _lora(args: argparse.Namespace, console: Console) -> int:
    from clients.lora_cli import run_lora

    return run_lora(args)


def _openai(args: argparse.Namespace, console: Console) -> int:
    from pipeline.cli_openai import run_openai

    return run_openai(args, say=lambda line: print(line, flush=True), build_package=_packaged_repository, state_dir=_serve_state_dir)


def _bench(args: argparse.Namespace, console: Console) -> int:
    from bench.commands import run_bench_command

    return run_bench_command(args, _build_cpu_target)


def _validate(loaded: LoadedConfig, store: ArtifactStore, args: argparse.Namespace, console: Console) -> int:
    spec = loaded.spec
    console.print(f"[green]valid[/green]: {args.config} (build {spec.name!r}, target {spec.build.target.value}, model {loaded.model.architecture})")
    console.print(quantization_summary(loaded.model, loaded.spec.build.target), markup=False, highlight=False)
    return 0


def _stop(loaded: LoadedConfig, store: ArtifactStore, args: argparse.Namespace, console: Console) -> int:
    from pipeline.serve import stop_detached

    console.print(stop_detached(_serve_state_dir(store)).message(), markup=False)
    return 0


def _run(loaded: LoadedConfig, store: ArtifactStore, args: argparse.Namespace, console: Console) -> int:
    the_plan = make_plan(loaded)  # one plan per command: it hashes every input (through the hash cache)
    check_runnable(loaded, the_plan, args.until)
    _plan(loaded, store, args, console, the_plan)
    results = run_pipeline(loaded, store, until=args.until, force=args.force, console=console, the_plan=the_plan)
    built = sum(r.outcome == "built" for r in results)
    console.print(f"[bold]done[/bold]: {built} built, {len(results) - built} cached; artifacts in {store.build_dir}")
    return 0


def _build_cpu_target(loaded: LoadedConfig, store: ArtifactStore, command: str, until: str) -> dict[str, StageResult]:
    """What the cpu-only commands share: refuse a target whose Triton does not run here, then build (or reuse)
    up to `until`, reporting the stages on stderr so stdout carries only the command's own output."""

    target = loaded.spec.build.target
    if not backend_for(target).serves_here:
        raise SpecError(
            f"{command} runs the cpu target here (no TensorRT-LLM on this machine); {loaded.path} has build.target {target.value!r}"
            + ("; deploy it with docker compose on a GPU host" if command == "serve" else "")
        )
    return {r.name: r for r in run_pipeline(loaded, store, until=until, console=_stderr_console())}


def _stderr_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _generate(loaded: LoadedConfig, store: ArtifactStore, args: argparse.Namespace, console: Console) -> int:
    from pipeline.backends.cpu.generate import generate_offline

    results = _build_cpu_target(loaded, store, "generate", "build")
    generation = generate_offline(
        results["build"].ref.engine_dir,
        results["prepare"].ref.path,
        args.prompt,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
    )
    if args.json:
        print(json.dumps(generation.to_json(), ensure_ascii=False))
    else:
        print(generation.prompt + generation.text)
    return 0


def _deploy(loaded: LoadedConfig, store: ArtifactStore, args: argparse.Namespace, console: Console) -> int:
    from pipeline.deploy.registry import deployer_for

    if (args.services or args.extra_files) and not args.up:
        raise SpecError("--service and --file choose what `deploy --up` starts: add --up", hint="trtllm-pipeline deploy CONFIG --up --service NAME")
    results = {r.name: r for r in run_pipeline(loaded, store, until="deploy", console=console)}
    _verify_shipped(store, results, ("deploy",))
    deployer = deployer_for(loaded.spec.deploy.kind)
    deployer.export(results["deploy"].ref.deploy_dir, args.out)
    console.print(f"deployment in {args.out}: {deployer.start_command(loaded.spec, args.out)}")
    if args.up:
        deployer.up(loaded.spec, args.out, services=args.services, extra_files=[path.resolve() for path in args.extra_files])
    return 0


def _verify_shipped(store: ArtifactStore, results: dict[str, StageResult], names: tuple[str, ...]) -> None:
    """What a server or a deployment will run is re-read in full (a cached artifact was checked
    against the hash cache only; one built by this command was hashed as it was sealed)."""
    for name in names:
        if name in results and results[name].outcome == "cached":
            store.verify_fully(results[name].ref)


def _packaged_repository(loaded: LoadedConfig, store: ArtifactStore) -> Path:

    return _build_cpu_target(loaded, store, "openai", "package")["package"].ref.repository_dir


def _serve_state_dir(store: ArtifactStore) -> Path:
    # Next to the stage artifacts, not inside one: a running server must not touch verified files.
    return store.build_dir / ".serve"


def _serve(loaded: LoadedConfig, store: ArtifactStore, args: argparse.Namespace, console: Console) -> int:
    from pipeline.serve import ServerOptions, serve_foreground, start_detached

    backend_for(loaded.spec.build.target).check_serving_host(loaded.spec, lambda: _built_engine(loaded, store))
    results = _build_cpu_target(loaded, store, "serve", "package")
    _verify_shipped(store, results, ("prepare", "build", "package"))
    options = ServerOptions.from_deploy(loaded.spec.deploy, results["package"].ref.repository_dir)
    if args.detach:
        state = start_detached(options, _serve_state_dir(store), timeout=args.timeout, on_cleanup=lambda stale: console.print(stale.message(), markup=False))
        console.print(f"serving {loaded.spec.serve.model_name!r} (pid {state.pid}): HTTP {state.http_url} · gRPC {state.grpc_url}")
        console.print(f"stop it with: trtllm-pipeline stop {args.config}")
        return 0
    return serve_foreground(options, out=console.print, timeout=args.timeout)


def _built_engine(loaded: LoadedConfig, store: ArtifactStore) -> tuple[Path, dict] | None:
    """The engine directory and build notes of the spec's build artifact, if it exists (for the target's
    check of this machine's runtime before serving: pipeline/backends/engine/runtime.py)."""

    build = store.lookup(make_plan(loaded).stage("build"))
    if build is None:
        return None
    return build.engine_dir, build.manifest.get("notes", {})


def _plan(loaded: LoadedConfig, store: ArtifactStore, args: argparse.Namespace, console: Console, the_plan: Plan | None = None) -> int:
    if getattr(args, "gpu", None):
        print_capacity(loaded, gpu=args.gpu, tp=args.tp, console=console)
    the_plan = the_plan or make_plan(loaded)
    states = {stage.name: artifact_state(store, stage) for stage in the_plan.stages}
    if getattr(args, "json", False):
        data = the_plan.to_json()
        for entry in data["stages"]:
            entry["state"] = states[entry["name"]]
            entry["cached"] = states[entry["name"]] == "built"
            entry["path"] = str(store.path_for(the_plan.stage(entry["name"])))
        print(json.dumps(data, indent=2, sort_keys=True))
        return 0
    table = Table(title=f"plan for {loaded.spec.name} ({loaded.path})", title_justify="left")
    for column in ("stage", "digest", "state", "what it does"):
        table.add_column(column)
    for stage in the_plan.stages:
        state = states[stage.name]
        shown = "[cyan]cached[/cyan]" if state == "built" else ("[yellow]to build[/yellow]" if state == "missing" else f"[red]{state}[/red]")
        table.add_row(stage.name, stage.digest, shown, stage.summary)
    console.print(table)
    console.print(quantization_summary(loaded.model, loaded.spec.build.target), markup=False, highlight=False)
    speculative = speculative_summary(loaded.spec.build)
    if speculative is not None:
        console.print(speculative, highlight=False)
    return 0


def _verify(loaded: LoadedConfig, store: ArtifactStore, args: argparse.Namespace, console: Console) -> int:
    table = Table(title=f"artifacts of {loaded.spec.name} in {store.build_dir}, every file re-read", title_justify="left")
    for column in ("stage", "state", "path"):
        table.add_column(column)
    bad = []
    started, before = time.monotonic(), file_hashes().hashed_bytes
    for stage in make_plan(loaded).stages:
        path = store.path_for(stage)
        if not path.is_dir():
            table.add_row(stage.name, "missing", str(path))
            continue
        try:
            found = differences(path, read_manifest(path), full=True)
        except ArtifactError as error:
            found = [error.message]
        table.add_row(stage.name, "[green]ok[/green]" if not found else f"[red]{len(found)} difference(s)[/red]", str(path))
        bad += found
    console.print(table)
    read = file_hashes().hashed_bytes - before
    console.print(f"read {read / 1e9:.2f} GB in {time.monotonic() - started:.1f} s")
    if bad:
        raise ArtifactError("artifacts differ from their manifests:\n  " + "\n  ".join(bad), hint="`trtllm-pipeline run` rebuilds what failed verification")
    return 0


def _status(loaded: LoadedConfig, store: ArtifactStore, args: argparse.Namespace, console: Console) -> int:
    the_plan = make_plan(loaded)
    table = Table(title=f"artifacts of {loaded.spec.name} in {store.build_dir}", title_justify="left")
    for column in ("stage", "state", "path"):
        table.add_column(column)
    current = set()
    for stage in the_plan.stages:
        current.add(stage.dirname)
        table.add_row(stage.name, artifact_state(store, stage), str(store.path_for(stage)))
    if store.build_dir.is_dir():
        for entry in sorted(store.build_dir.iterdir()):
            if entry.is_dir() and not entry.name.startswith(".") and entry.name not in current:
                table.add_row(entry.name.rsplit("-", 1)[0], "[dim]older (not in the current plan)[/dim]", str(entry))
    console.print(table)
    return 0


def _schema(args: argparse.Namespace, console: Console) -> int:
    text = config_reference_markdown() if args.markdown else spec_schema_text()
    if args.write:
        SCHEMA_PATH.write_text(text)
        console.print(f"wrote {SCHEMA_PATH}")
    else:
        sys.stdout.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    console = Console(highlight=False, soft_wrap=True)
    errors = Console(stderr=True, highlight=False, soft_wrap=True)
    argv = sys.argv[1:] if argv is None else argv
    verbose = "--verbose" in argv or "-v" in argv
    try:
        return run_cli(argv, console)
    except PipelineError as exc:
        if verbose:
            errors.print(traceback.format_exc(), markup=False)
        errors.print(f"error: {exc.message}", markup=False, soft_wrap=True)
        errors.print(f"hint: {exc.hint}", markup=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        errors.print("interrupted", markup=False)
        return 130
    except Exception as exc:  # the one boundary: anything unexpected is a bug, reported in one line
        if verbose:
            errors.print(traceback.format_exc(), markup=False)
        errors.print(f"error: internal error: {type(exc).__name__}: {exc}", markup=False, soft_wrap=True)
        errors.print("hint: re-run with --verbose for the traceback, and please report it", markup=False)
        return 1
