"""API keys of the OpenAI front end: the syntax of a key file and of `TRTLLM_PIPELINE_API_KEYS`, and which key a client sends.

One syntax for both: entries separated by newlines or commas, each `KEY` or `NAME:KEY`; whitespace around an entry
is ignored, blank entries and lines starting with `#` are skipped. A KEY is 16 to 512 characters of a Bearer token
(RFC 6750: A-Z a-z 0-9 - . _ ~ + /, then `=` padding only at the end), so it never holds `:` or `,`. A NAME (a letter,
then letters, digits, `_`, `.`, `-`; at most 64) labels the key in metrics and messages, never the key itself; an
unnamed key is `key<N>`, N its place among the entries (key1, key2, …). Names and keys are unique.

Errors (`ApiKeyError`) name the file or variable and the line, never a key nor a name read from the file: a line
written the wrong way round (`KEY:NAME`) would otherwise print the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

API_KEYS_VARIABLE = "TRTLLM_PIPELINE_API_KEYS"
MIN_KEY_LENGTH = 16
MAX_KEY_LENGTH = 512
MAX_KEY_FILE_BYTES = 1 << 20
_KEY = re.compile(r"[A-Za-z0-9._~+/-]+=*")
KEY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
SYNTAX = "KEY or NAME:KEY per line (or comma-separated)"


class ApiKeyError(ValueError):
    """A key file or variable that cannot be used; the message names where, never a key."""


@dataclass(frozen=True)
class ApiKey:
    name: str
    secret: str = field(repr=False)


def parse_api_keys(text: str, source: str) -> tuple[ApiKey, ...]:
    """Every key of `text` (a key file's content or the variable's value); `source` names it in errors.
    At least one key: an empty list would leave the server open while its operator believes it closed."""
    keys: list[ApiKey] = []
    seen_names: dict[str, str] = {}
    seen_secrets: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip().startswith("#"):
            continue
        entries = [entry.strip() for entry in line.split(",")]
        entries = [entry for entry in entries if entry]
        for index, entry in enumerate(entries, start=1):
            where = f"{source} line {number}" + (f", entry {index}" if len(entries) > 1 else "")
            key = _entry(entry, where, len(keys) + 1)
            if key.name in seen_names:
                raise ApiKeyError(f"{where}: the key's name is also the name at {seen_names[key.name]}; names must be unique")
            if key.secret in seen_secrets:
                raise ApiKeyError(f"{where}: the same key as at {seen_secrets[key.secret]}; give each key once")
            seen_names[key.name] = seen_secrets[key.secret] = where.removeprefix(f"{source} ")
            keys.append(key)
    if not keys:
        raise ApiKeyError(f"{source} holds no API key (only blank or comment lines): give at least one, {SYNTAX}, or leave it out to serve without keys")
    return tuple(keys)


def _entry(entry: str, where: str, position: int) -> ApiKey:
    name, separator, secret = entry.rpartition(":")
    if not separator:
        name = f"key{position}"
    elif not KEY_NAME.fullmatch(name.strip()):
        raise ApiKeyError(f"{where}: the part before ':' is not a name (a letter, then letters, digits, _ . -; at most 64)")
    secret = secret.strip()
    if len(secret) < MIN_KEY_LENGTH:
        raise ApiKeyError(f"{where}: the key is shorter than {MIN_KEY_LENGTH} characters")
    if len(secret) > MAX_KEY_LENGTH:
        raise ApiKeyError(f"{where}: the key is longer than {MAX_KEY_LENGTH} characters")
    if not _KEY.fullmatch(secret):
        raise ApiKeyError(f"{where}: the key has a character a Bearer token cannot hold (A-Z a-z 0-9 - . _ ~ + /, and = only at the end)")
    return ApiKey(name.strip(), secret)


def read_api_key_file(path: Path) -> tuple[ApiKey, ...]:
    try:
        if path.stat().st_size > MAX_KEY_FILE_BYTES:
            raise ApiKeyError(f"API key file {path} is larger than {MAX_KEY_FILE_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ApiKeyError(f"API key file {path} is not UTF-8 text") from None
    except OSError as error:
        raise ApiKeyError(f"cannot read API key file {path}: {error.strerror or error}") from None
    return parse_api_keys(text, f"API key file {path}")


def configured_api_keys(key_file: Path | None, environ: Mapping[str, str] | None = None) -> tuple[ApiKey, ...] | None:
    """The server's keys: from `key_file`, else from the variable; None when neither is given (no keys: open).
    A variable that is set but holds no key is an error, as is giving both (which would the server trust?)."""
    environ = os.environ if environ is None else environ
    if key_file is not None and API_KEYS_VARIABLE in environ:
        raise ApiKeyError(f"both --api-key-file and {API_KEYS_VARIABLE} are set: give the keys one way")
    return given_api_keys(key_file, environ)


def bearer_headers(api_key: str | None) -> dict[str, str]:
    """What a client sends with `api_key` (nothing without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def given_api_keys(key_file: Path | None, environ: Mapping[str, str] | None = None) -> tuple[ApiKey, ...] | None:
    """The keys given to a client command (bench, the performance gate, infer): those of `key_file` if given, else
    those of the variable, else None. A client sends the first; a server the command starts itself trusts them all."""
    environ = os.environ if environ is None else environ
    if key_file is not None:
        return read_api_key_file(key_file)
    value = environ.get(API_KEYS_VARIABLE)
    return None if value is None else parse_api_keys(value, API_KEYS_VARIABLE)
