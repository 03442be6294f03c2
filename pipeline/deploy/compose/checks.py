"""Checks a compose document must pass beyond the Compose Specification JSON schema.

The schema checks shapes; `docker compose config` (and `up`) also reject, or silently
misread, things the schema lets through. These are the ones a rendering bug could produce:

- interpolation: `${VAR}`, `${VAR:-default}`, `${VAR:?error}` syntax; every variable defined in .env;
- profiles: valid names; a `depends_on` target is enabled in every profile of its dependent;
- ports: `[IP:]HOST:CONTAINER[/PROTO]` with a valid IP (IPv6 in brackets), ports in 1..65535,
  no host port published twice;
- volumes: bind sources relative as `./`/`../` (else compose reads a volume name), absolute
  targets, named volumes declared at the top level, no target mounted twice;
- durations (`stop_grace_period`, healthcheck), `shm_size`, ulimits soft ≤ hard, restart policy,
  healthcheck test form, device reservations (capabilities required; count or device_ids);
- environment values are strings; images are pinned (tag other than latest, or digest).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator, Mapping
from typing import Any

from pipeline.errors import StageError

_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_VARIABLE_BODY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])(.*))?$", re.S)
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+$")
_SIZE = re.compile(r"^\d+[bkmgBKMG]?$")
_RESTART = re.compile(r"^(?:no|always|unless-stopped|on-failure(?::\d+)?)$")
_TOP_LEVEL = {"version", "services", "networks", "volumes", "secrets", "configs"}
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def lint_compose(document: Mapping[str, Any], *, env: Mapping[str, str] | None = None) -> list[str]:
    """Every problem found (empty when the document is fine). With `env`, variables must be defined in it."""
    problems: list[str] = []
    for key in document:
        if key not in _TOP_LEVEL and not str(key).startswith("x-"):
            problems.append(f"top level: unknown key {key!r}")
    problems += _interpolation_problems(document, env)
    services: Mapping[str, Any] = document.get("services") or {}
    declared_volumes = set((document.get("volumes") or {}).keys())
    host_ports: dict[tuple[str, int], str] = {}
    for name, service in services.items():
        where = f"services.{name}"
        if not _NAME.match(name):
            problems.append(f"{where}: invalid service name")
        problems += _profile_problems(where, service, services)
        problems += _port_problems(where, service.get("ports", []), host_ports)
        problems += _volume_problems(where, service.get("volumes", []), declared_volumes)
        problems += _scalar_problems(where, service)
        problems += _healthcheck_problems(where, service.get("healthcheck"))
        problems += _device_problems(where, service.get("deploy"))
        if "image" not in service and "build" not in service:
            problems.append(f"{where}: needs an image or a build")
        elif "image" in service and "build" not in service and not is_pinned(service["image"]):
            problems.append(f"{where}.image: {service['image']!r} is not pinned (a tag other than latest, or a digest)")
    return problems


def check_compose(document: Mapping[str, Any], *, env: Mapping[str, str] | None = None) -> None:
    problems = lint_compose(document, env=env)
    if problems:
        raise StageError(
            "the rendered compose file would not pass `docker compose config`:\n  " + "\n  ".join(problems),
            hint="this is a bug in pipeline.deploy; the deployment was not written",
        )


def is_pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


def duration_seconds(text: str) -> float:
    """A compose duration (`1m30s`, `90s`, `500ms`) in seconds; ValueError if it is not one."""
    if not _DURATION.match(text):
        raise ValueError(f"{text!r} is not a compose duration such as 90s or 1m30s")
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", text))


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's interpolation of one string (`$$` is a literal `$`); ValueError for a `:?`/`?` error."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        match = _VARIABLE.match(text, i) if text.startswith("${", i) else None
        if match is None:
            out.append(text[i])
            i += 1
            continue
        out.append(_substitute(match.group(1), env))
        i = match.end()
    return "".join(out)


def _substitute(body: str, env: Mapping[str, str]) -> str:
    parsed = _VARIABLE_BODY.match(body)
    if parsed is None:
        raise ValueError(f"invalid interpolation ${{{body}}}")
    name, operator, argument = parsed.group(1), parsed.group(2), parsed.group(3) or ""  # group 3 is set whenever 2 is
    value = env.get(name)
    if operator is None:
        return value or ""
    unset_or_empty = value is None or (operator.startswith(":") and value == "")
    if operator.endswith("-"):
        return argument if unset_or_empty else value or ""
    if operator.endswith("?"):
        if unset_or_empty:
            raise ValueError(f"{name}: {argument}")
        return value or ""
    return "" if unset_or_empty else argument  # `+`: the argument when set


def strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(dotted path, string) for every string in a document (keys included)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from strings(key, f"{path}.<key>")
            yield from strings(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from strings(item, f"{path}[{index}]")
    elif isinstance(value, str):
        yield path, value


def _interpolation_problems(document: Mapping[str, Any], env: Mapping[str, str] | None) -> list[str]:
    problems = []
    for path, text in strings(document):
        stripped = text.replace("$$", "")
        if stripped.count("${") != len(_VARIABLE.findall(stripped)):
            problems.append(f"{path}: unterminated ${{ in {text!r}")
            continue
        try:
            interpolate(text, env if env is not None else _Permissive())
        except ValueError as error:
            problems.append(f"{path}: {error}")
    return problems


class _Permissive(dict):
    """Without an env every variable counts as set: only the syntax is checked."""

    def get(self, key: str, default: Any = None) -> str:
        return "x"


def _profile_problems(where: str, service: Mapping[str, Any], services: Mapping[str, Any]) -> list[str]:
    problems = []
    profiles = service.get("profiles", [])
    for profile in profiles:
        if not isinstance(profile, str) or not re.match(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$", profile):
            problems.append(f"{where}.profiles: invalid profile name {profile!r}")
    depends_on = service.get("depends_on", {})
    for dependency in depends_on if isinstance(depends_on, (list, Mapping)) else []:
        target = services.get(dependency)
        if target is None:
            problems.append(f"{where}.depends_on: no service {dependency!r}")
            continue
        target_profiles = target.get("profiles", [])
        if target_profiles:
            active_without = [p for p in profiles or ["(no profile)"] if p not in target_profiles]
            if active_without:
                problems.append(f"{where}.depends_on: {dependency!r} is disabled under profile(s) {', '.join(active_without)}")
    return problems


def parse_port(spec: str) -> tuple[str | None, int | None, int, str]:
    """(host ip, host port, container port, protocol) of a short-syntax port; ValueError if invalid."""
    body, _, protocol = spec.partition("/")
    if protocol not in ("", "tcp", "udp", "sctp"):
        raise ValueError(f"unknown protocol {protocol!r}")
    address = None
    if body.startswith("["):
        end = body.index("]")
        address, body = body[1:end], body[end + 2 :]
        ipaddress.IPv6Address(address)
    parts = body.split(":")
    if address is None and len(parts) == 3:
        address = parts[0]
        ipaddress.IPv4Address(address)
        parts = parts[1:]
    if len(parts) > 2 or any(not part.isdigit() for part in parts):
        raise ValueError("expected [IP:]HOST:CONTAINER with numeric ports")
    numbers = [int(part) for part in parts]
    if any(not 1 <= number <= 65535 for number in numbers):
        raise ValueError("ports must be in 1..65535")
    host = numbers[0] if len(numbers) == 2 else None
    return address, host, numbers[-1], protocol or "tcp"


def _port_problems(where: str, ports: list[Any], seen: dict[tuple[str, int], str]) -> list[str]:
    problems = []
    for port in ports:
        if not isinstance(port, str):
            problems.append(f"{where}.ports: write {port!r} as a quoted string")
            continue
        try:
            address, host, _, protocol = parse_port(port)
        except ValueError as error:
            problems.append(f"{where}.ports: {port!r}: {error}")
            continue
        if host is not None:
            key = (f"{address or '0.0.0.0'}/{protocol}", host)
            if key in seen:
                problems.append(f"{where}.ports: host port {host} is also published by {seen[key]}")
            seen[key] = where
    return problems


def _volume_problems(where: str, volumes: list[Any], declared: set[str]) -> list[str]:
    problems = []
    targets: set[str] = set()
    for volume in volumes:
        if not isinstance(volume, Mapping):
            problems.append(f"{where}.volumes: use the long syntax, got {volume!r}")
            continue
        kind, source, target = volume.get("type"), str(volume.get("source", "")), str(volume.get("target", ""))
        if not target.startswith("/"):
            problems.append(f"{where}.volumes: target {target!r} must be an absolute path")
        if target in targets:
            problems.append(f"{where}.volumes: {target} is mounted twice")
        targets.add(target)
        if kind == "bind" and not (source.startswith(("./", "../", "/")) or source in (".", "..")):
            problems.append(f"{where}.volumes: bind source {source!r} must start with ./, ../ or /")
        elif kind == "volume" and source not in declared:
            problems.append(f"{where}.volumes: named volume {source!r} is not declared under the top-level volumes")
        elif kind not in ("bind", "volume", "tmpfs"):
            problems.append(f"{where}.volumes: unknown type {kind!r}")
    return problems


def _scalar_problems(where: str, service: Mapping[str, Any]) -> list[str]:
    problems = []
    if "stop_grace_period" in service and not _DURATION.match(str(service["stop_grace_period"])):
        problems.append(f"{where}.stop_grace_period: {service['stop_grace_period']!r} is not a duration")
    if "shm_size" in service and not _SIZE.match(str(service["shm_size"])):
        problems.append(f"{where}.shm_size: {service['shm_size']!r} is not a size such as 2g")
    if "restart" in service and not _RESTART.match(str(service["restart"])):
        problems.append(f"{where}.restart: {service['restart']!r} is not a restart policy")
    if "user" in service and not re.match(r"^[A-Za-z0-9_.-]+(?::[A-Za-z0-9_.-]+)?$", str(service["user"])):
        problems.append(f"{where}.user: {service['user']!r} is not USER[:GROUP]")
    for name, limit in (service.get("ulimits") or {}).items():
        soft, hard = (limit["soft"], limit["hard"]) if isinstance(limit, Mapping) else (limit, limit)
        if hard != -1 and (soft == -1 or soft > hard):  # -1: unlimited
            problems.append(f"{where}.ulimits.{name}: soft limit above hard limit")
    environment = service.get("environment") or {}
    if isinstance(environment, Mapping):
        for key, value in environment.items():
            if not isinstance(value, str):
                problems.append(f"{where}.environment.{key}: write {value!r} as a quoted string")
    return problems


def _healthcheck_problems(where: str, health: Mapping[str, Any] | None) -> list[str]:
    if health is None:
        return []
    problems = []
    test = health.get("test")
    if isinstance(test, list) and (not test or test[0] not in ("CMD", "CMD-SHELL", "NONE")):
        problems.append(f"{where}.healthcheck.test: a list must start with CMD, CMD-SHELL or NONE")
    for key in ("interval", "timeout", "start_period"):
        if key in health and not _DURATION.match(str(health[key])):
            problems.append(f"{where}.healthcheck.{key}: {health[key]!r} is not a duration")
    return problems


def _device_problems(where: str, deploy: Mapping[str, Any] | None) -> list[str]:
    devices = (((deploy or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []
    problems = []
    for device in devices:
        if not device.get("capabilities"):
            problems.append(f"{where}.deploy.resources.reservations.devices: capabilities are required")
        if "count" in device and "device_ids" in device:
            problems.append(f"{where}.deploy.resources.reservations.devices: count and device_ids are exclusive")
    return problems
