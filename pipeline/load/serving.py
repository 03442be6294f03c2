"""What a load test runs against when it starts the server itself: tritonserver on the packaged
repository on free loopback ports, and the OpenAI front end before it when asked for."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import StageError
from pipeline.load.sweep import Endpoints

if TYPE_CHECKING:
    from clients.api_keys import ApiKey

LOOPBACK = "127.0.0.1"


def free_ports(count: int) -> list[int]:
    probes = []
    for _ in range(count):
        probe = socket.socket()
        probe.bind((LOOPBACK, 0))
        probes.append(probe)
    ports = [probe.getsockname()[1] for probe in probes]
    for probe in probes:
        probe.close()
    return ports


def server_version(http_url: str) -> str | None:
    try:
        with urllib.request.urlopen(f"{http_url}/v2", timeout=10) as response:
            return json.loads(response.read()).get("version")
    except Exception:  # a figure for the recipe only
        return None


@contextlib.contextmanager
def serving(
    repo: Path,
    deploy: Any,
    *,
    model_name: str,
    openai: bool,
    startup_timeout: float = 180.0,
    say: Callable[[str], None] = lambda line: None,
    check_alive: bool = True,
    openai_triton_model: str | None = None,
    api_keys: Sequence[ApiKey] | None = None,
) -> Iterator[Endpoints]:
    """tritonserver on `repo` (free loopback ports), and the OpenAI front end before it when `openai` (calling
    `openai_triton_model`, by default the front end's default route (the ensemble), and asking for
    `api_keys`, if given; the endpoints then carry the first); the endpoints while the block runs, everything stopped
    afterwards. With `check_alive`, a server that died meanwhile is a StageError at the end of the block."""
    from pipeline.serve import ServerOptions, TritonServer

    http_port, grpc_port, metrics_port = free_ports(3)
    options = dataclasses.replace(
        ServerOptions.from_deploy(deploy, repo),
        bind_address=LOOPBACK,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        exit_timeout_secs=5,
    )
    with TritonServer(options) as server:
        say(f"starting tritonserver on {LOOPBACK} (HTTP {http_port}, gRPC {grpc_port})")
        server.wait_until_ready(timeout=startup_timeout)
        grpc = f"{LOOPBACK}:{grpc_port}"
        endpoints = Endpoints(
            grpc=grpc,
            http=options.http_url,
            model_name=model_name,
            server_version=server_version(options.http_url),
            server=server,
        )
        if not openai:
            yield endpoints
        else:
            from clients.openai_server.access import AccessPolicy, KeyRing
            from clients.openai_server.runner import running_openai_server
            from pipeline.serve.front_end_route import front_end_triton_model

            triton_model = openai_triton_model or front_end_triton_model("ensemble")
            access = AccessPolicy(KeyRing(api_keys)) if api_keys else AccessPolicy()
            with running_openai_server(grpc, model_name=model_name, host=LOOPBACK, port=free_ports(1)[0], triton_model=triton_model, access=access) as base_url:
                say(f"OpenAI front end at {base_url} (Triton model {triton_model!r}; {access.describe()})")
                yield dataclasses.replace(endpoints, openai=base_url, api_key=api_keys[0].secret if api_keys else None)
        if check_alive and not server.is_running():  # the measured failures would otherwise read as the model's
            raise StageError(f"tritonserver exited during the benchmark; its errors: {server.error_lines()}")
