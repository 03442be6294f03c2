"""Every command the README and the documentation pages (BENCHMARKS.md included) show is a real one: a renamed option or command fails
here, not in a reader's terminal.

Shell code blocks (bash, sh, shell, console or untagged) are commands: each `trtllm-pipeline ...` in them (also
after `&&`, `;` or `|`, on `\\`-continued lines, as `.venv/bin/trtllm-pipeline`) is parsed by the CLI's own
argparse parser, without running anything, and each `make TARGET` must name a rule of the Makefile. Inline code
that starts with `trtllm-pipeline` is a synopsis (`CONFIG`, `[--json]`, `{grpc,http}`): its command must exist
and every option it names must be one of that command's.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from pipeline.cli import _parser
from tests.conftest import REPO

PAGES = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]  # the site publishes BENCHMARKS.md too
SHELL_INFOS = {"", "bash", "sh", "shell", "console"}
CODE_BLOCK = re.compile(r"^ *(?P<fence>```+)(?P<info>[^\n`]*)\n(?P<body>.*?)^ *(?P=fence)[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(?<!`)`(?P<code>(?:trtllm-pipeline|make) [^`]*)`(?!`)")
OPERATORS = {"&&", "||", ";", "|", "&", ">", ">>", "<", "(", ")"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
WORD = re.compile(r"[A-Za-z][\w-]*")


def _relative(page: Path) -> str:
    return str(page.relative_to(REPO))


def _shell_lines(text: str) -> list[str]:
    """The lines of the page's shell code blocks, `\\`-continuations joined and `$ ` prompts dropped."""
    lines = []
    for block in CODE_BLOCK.finditer(text):
        if block["info"].strip().split(" ")[0] not in SHELL_INFOS:
            continue
        for line in block["body"].replace("\\\n", " ").splitlines():
            lines.append(line.strip().removeprefix("$ "))
    return lines


def _commands(line: str) -> list[list[str]]:
    """Each simple command of a shell line as its words, environment assignments in front of it dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, current = [], []
    for token in lexer:
        if token in OPERATORS:
            commands.append(current)
            current = []
        elif current or not ASSIGNMENT.match(token):
            current.append(token)
    return [command for command in [*commands, current] if command]


def _is_cli(word: str) -> bool:
    return word == "trtllm-pipeline" or word.endswith("/trtllm-pipeline")


def documented(kind: str) -> list[tuple[str, str]]:
    """(page, command or synopsis) of every `trtllm-pipeline` command (kind "cli"), `make` call ("make") or
    inline synopsis ("synopsis") in the README and the documentation pages."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        inline = [match["code"] for match in INLINE_CODE.finditer(CODE_BLOCK.sub("", text))]
        if kind == "synopsis":
            found += [(_relative(page), code) for code in inline if code.startswith("trtllm-pipeline")]
            continue
        if kind == "make":
            found += [(_relative(page), code) for code in inline if code.startswith("make ")]
        for line in _shell_lines(text):
            if ("trtllm-pipeline" if kind == "cli" else "make") not in line:
                continue
            for words in _commands(line):
                if (kind == "cli" and _is_cli(words[0])) or (kind == "make" and words[0] == "make"):
                    found.append((_relative(page), shlex.join(words)))
    return found


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def test_the_pages_document_commands():
    assert len(documented("cli")) > 50 and len(documented("synopsis")) > 15 and len(documented("make")) > 3


@pytest.mark.parametrize(("page", "command"), documented("cli"))
def test_each_documented_command_parses(page, command):
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            _parser().parse_args(shlex.split(command)[1:])
    except SystemExit:
        pytest.fail(f"{page}: `{command}` does not parse: {errors.getvalue().strip().splitlines()[-1]}")


@pytest.mark.parametrize(("page", "synopsis"), documented("synopsis"))
def test_each_documented_synopsis_names_a_command_and_its_options(page, synopsis):
    top = parser = _parser()
    path = ["trtllm-pipeline"]
    for word in WORD.findall(OPTION.sub(" ", synopsis.removeprefix("trtllm-pipeline"))):
        if word in _subcommands(parser):
            parser = _subcommands(parser)[word]
            path.append(word)
        elif parser is not top:  # before the command, a word is a top-level option's value (`--artifacts DIR`)
            break
    assert not _subcommands(parser), f"{page}: `{synopsis}` names no command of {' '.join(path)}: {', '.join(_subcommands(parser))}"
    unknown = [option for option in OPTION.findall(synopsis) if option not in _options(parser) | _options(top)]
    assert unknown == [], f"{page}: `{synopsis}`: {' '.join(path)} has no {', '.join(unknown)}"


@pytest.mark.parametrize(("page", "command"), documented("make"))
def test_each_documented_make_target_exists(page, command):
    rules = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", (REPO / "Makefile").read_text(encoding="utf-8"), re.M))
    targets = [word for word in shlex.split(command)[1:] if not word.startswith("-") and "=" not in word]
    assert targets and set(targets) <= rules, f"{page}: `{command}` names a target the Makefile does not have ({', '.join(sorted(rules))})"
