"""Every citation of a markdown file names one the repository holds, and every cited heading exists.

A maintainer who clones the repository has only what `git ls-files` lists: a comment, docstring, message, page or
data file that cites a design note kept elsewhere cannot be followed. So, in every tracked text file:

- a repository path of a markdown file (`docs/architecture.md`, `models/README.md`) must be a
  tracked file: a `./` or `../` path is read from the citing file's folder, any other from the repository root. A
  path whose first folder is not one of the repository's is another repository's file (`examples/eagle/README.md`
  of TensorRT-LLM), and so is one written right after a GitHub owner/name (`triton-inference-server/server
  docs/user_guide/metrics.md`), the way sources are cited here. `shared/` is always ours: the design notes that
  sessions keep next to a checkout live there and are not in the repository;
- a bare markdown file name (`BENCHMARKS.md`) must be the name of a tracked file;
- the design document cited by name and section number alone (the upper-case note with a section sign) is refused;
- an anchor (`docs/architecture.md#layers`, `targets.md#model-families`) must be a heading of that file, slugged as
  the documentation site slugs it (mkdocs.yml: pymdownx's slugify, lower case: markup and punctuation dropped,
  spaces to '-', a repeated heading gets `_1`, `_2`; an attr_list `{#id}` wins).

Each finding names the citing file and line. Files over MAX_BYTES are data (tokenizers, recorded samples), not
prose, and are not read.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from functools import cache
from pathlib import Path, PurePosixPath

import pytest

from tests.conftest import REPO

MAX_BYTES = 1 << 20
MARKDOWN_PATH = re.compile(r"(?<![\w/.-])(?P<path>(?:\.\.?/)*(?:[\w-]+/)*[\w.-]*\w\.md)(?:#(?P<anchor>[\w-]+))?(?![\w/])")
# A GitHub owner/name (no file extension in the name) and only blanks or a comment marker before the path.
OTHER_REPOSITORY = re.compile(r"(?:^|[\s(`])[A-Za-z0-9][\w-]*/[A-Za-z0-9][\w-]*[ \t]*(?:\n[ \t]*[#*]*[ \t]*)?$")
UNCITABLE_NOTE = re.compile(r"\bARCHITECTURE" r" ?§")
ALWAYS_OURS = "shared"
FENCE = re.compile(r"^ {0,3}(```|~~~)")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(?P<text>.*?)(?:[ \t]+#+)?[ \t]*$")
ATTR_ID = re.compile(r"\s*\{[^}]*#(?P<id>[\w-]+)[^}]*\}\s*$")


@cache
def tracked_files() -> frozenset[str]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc})")
    return frozenset(name for name in listed.decode().split("\0") if name)


@cache
def top_level_names() -> frozenset[str]:
    return frozenset(PurePosixPath(name).parts[0] for name in tracked_files()) | {ALWAYS_OURS}


@cache
def tracked_basenames() -> frozenset[str]:
    return frozenset(PurePosixPath(name).name for name in tracked_files())


def slugify(text: str) -> str:
    """pymdownx.slugs.slugify(case="lower") of a heading's text as Markdown renders it (tags stripped)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links and images: their text
    text = re.sub(r"<[^>]*>", "", text).replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFC", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors_of(name: str) -> frozenset[str]:
    """The heading ids of the tracked markdown file `name` (ATX headings outside fenced code)."""
    anchors: set[str] = set()
    fenced = False
    for line in (REPO / name).read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        heading = None if fenced else HEADING.match(line)
        if heading is None:
            continue
        text = heading["text"]
        explicit = ATTR_ID.search(text)
        slug = explicit["id"] if explicit else slugify(text)
        unique, count = slug, 0
        while unique in anchors:
            count += 1
            unique = f"{slug}_{count}"
        anchors.add(unique)
    return frozenset(anchors)


def _resolve(citing: str, path: str) -> str | None:
    """The tracked file a repository path names ('' when it names none), or None for another repository's path."""
    parts = PurePosixPath(path).parts
    if parts[0] in (".", ".."):
        resolved = (REPO / PurePosixPath(citing).parent / path).resolve()
        try:
            relative = resolved.relative_to(REPO.resolve()).as_posix()
        except ValueError:
            return ""  # outside the repository: nothing a clone holds
        return relative if relative in tracked_files() else ""
    if len(parts) == 1:
        near = (PurePosixPath(citing).parent / path).as_posix()
        if near in tracked_files():
            return near
        if path in tracked_files():
            return path
        same_name = [name for name in tracked_files() if PurePosixPath(name).name == path]
        return same_name[0] if len(same_name) == 1 else ("" if path not in tracked_basenames() else None)
    if parts[0] not in top_level_names():
        return None
    return path if path in tracked_files() else ""


def citation_problems(citing: str, text: str) -> list[str]:
    problems = []
    for note in UNCITABLE_NOTE.finditer(text):
        line = text.count("\n", 0, note.start()) + 1
        problems.append(f"{citing}:{line}: cites {note[0]!r}, a design note the repository does not hold")
    for match in MARKDOWN_PATH.finditer(text):
        path, anchor = match["path"], match["anchor"]
        line = text.count("\n", 0, match.start()) + 1
        if "/" in path and OTHER_REPOSITORY.search(text[max(0, match.start() - 200) : match.start()]):
            continue
        target = _resolve(citing, path)
        if target is None:
            continue
        if target == "":
            problems.append(f"{citing}:{line}: cites {path}, which the repository does not hold")
        elif anchor and anchor not in anchors_of(target):
            problems.append(f"{citing}:{line}: cites {path}#{anchor}, but {target} has no such heading")
    return problems


def _text_files() -> list[str]:
    this_file = Path(__file__).resolve().relative_to(REPO.resolve()).as_posix()  # its fixtures cite what is missing on purpose
    names = []
    for name in sorted(tracked_files()):
        path = REPO / name
        if name == this_file or not path.is_file() or path.stat().st_size > MAX_BYTES:
            continue
        names.append(name)
    return names


def test_every_cited_markdown_file_and_heading_exists():
    problems = []
    for name in _text_files():
        data = (REPO / name).read_bytes()
        if b"\0" in data:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        problems.extend(citation_problems(name, text))
    assert problems == [], "citations of files or headings the repository does not hold:\n" + "\n".join(problems)


# Built from parts, so that this file does not cite what it shows missing.
MISSING_HEADING = "no-such-" + "heading"
MISSING_PAGE = "no-such-" + "page"
LOST_NOTE = "notes-we-" + "lost"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see docs/architecture.md#layers", []),
        (f"see docs/architecture.md#{MISSING_HEADING}", [f"docs/architecture.md#{MISSING_HEADING}"]),
        (f"see docs/{MISSING_PAGE}.md", [f"docs/{MISSING_PAGE}.md"]),
        (f"(shared/reference/{LOST_NOTE}.md §1.2)", [f"shared/reference/{LOST_NOTE}.md"]),
        ("design (ARCHITECTURE" + ".md §4)", ["ARCHITECTURE.md"]),
        ("design (ARCHITECTURE" + " §4)", ["ARCHITECTURE §"]),
        (f"facts ({LOST_NOTE}.md §1.2)", [f"{LOST_NOTE}.md"]),
        ("../BENCHMARKS.md#soak-64-concurrent-streams-half-of-them-cut-cpu-issue-11", []),
        ("triton-inference-server/tensorrtllm_backend docs/model_config.md", []),
        ("NVIDIA/TensorRT-LLM\n# docs/source/performance/perf-overview.md", []),
        ("TensorRT-LLM's examples/eagle/README.md", []),
        (f"(pipeline/render/contract.py, docs/architecture.md#{MISSING_HEADING})", [f"docs/architecture.md#{MISSING_HEADING}"]),
        ("https://github.com/grpc/grpc/blob/master/doc/health-checking.md", []),
        ("[Targets](targets.md#model-families)", []),
    ],
)
def test_the_scan_finds_what_a_clone_lacks(text, expected):
    problems = citation_problems("docs/example.md", text)  # a page: its relative links are read from docs/
    assert len(problems) == len(expected), problems
    for problem, cited in zip(problems, expected, strict=True):
        assert cited in problem and (":1:" in problem)


def test_slugs_follow_the_site():
    assert slugify("Soak: 64 concurrent streams, half of them cut (cpu, issue #11)") == "soak-64-concurrent-streams-half-of-them-cut-cpu-issue-11"
    assert slugify("Extending: one place per fact") == "extending-one-place-per-fact"
    assert slugify("`tensorrt_llm` parameters") == "tensorrt_llm-parameters"
    assert {"layers", "stage-rules", "tensor-contract", "serving-under-abuse"} <= anchors_of("docs/architecture.md")
