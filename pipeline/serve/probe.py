"""HTTP probes of a running tritonserver (standard library only): liveness, per-model state."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass

_TIMEOUT = 2.0


@dataclass(frozen=True)
class ModelState:
    name: str
    state: str  # READY, UNAVAILABLE, LOADING, ...
    reason: str = ""

    @property
    def ready(self) -> bool:
        return self.state == "READY"


def is_live(http_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{http_url}/v2/health/live", timeout=_TIMEOUT) as response:
            return response.status == 200
    except (TimeoutError, urllib.error.URLError, ConnectionError, OSError):
        return False


def metrics_up(metrics_url: str) -> bool:
    try:
        with urllib.request.urlopen(metrics_url, timeout=_TIMEOUT) as response:
            return response.status == 200
    except (TimeoutError, urllib.error.URLError, ConnectionError, OSError):
        return False


def model_states(http_url: str) -> dict[str, ModelState]:
    """Every model of the repository index, with its state and the reason it is not ready."""
    request = urllib.request.Request(f"{http_url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
        entries = json.loads(response.read().decode("utf-8"))
    states = {}
    for entry in entries:
        name = entry.get("name", "")
        states[name] = ModelState(name, entry.get("state", "UNKNOWN"), entry.get("reason", ""))
    return states


def port_in_use(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError:
            return True
    return False
