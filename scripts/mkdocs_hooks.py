"""MkDocs hooks (mkdocs.yml `hooks:`): the pages' links to the rest of the repository.

A page under docs/ links to a repository file the way GitHub and a checkout resolve it, relative to docs/
(`../BENCHMARKS.md`, `../build_configs/tiny-cpu.yaml`). In the site, BENCHMARKS.md (the record, kept at the
root) is a page of its own, so links to it stay links; other repository files are not published, so a link to one
becomes its text. A link to a repository file that does not exist is a warning, which fails `mkdocs build --strict`
as a broken link between pages does.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from mkdocs.structure.files import File

RECORD = "BENCHMARKS.md"
LOG = logging.getLogger("mkdocs.hooks.repository_links")
REPOSITORY_LINK = re.compile(r"\[(?P<text>[^\]]+)\]\(\.\./(?P<path>[^)#\s]+)(?P<anchor>#[^)\s]*)?\)")


def on_files(files, config):
    """Publish the root BENCHMARKS.md as the page BENCHMARKS.md; its own links into docs/ become links between pages."""
    text = (_root(config) / RECORD).read_text(encoding="utf-8")
    files.append(File.generated(config, RECORD, content=text.replace("](docs/", "](")))
    return files


def on_page_markdown(markdown, page, config, files):
    root = _root(config)

    def resolve(link: re.Match) -> str:
        path = link["path"]
        if path == RECORD:
            return f"[{link['text']}]({RECORD}{link['anchor'] or ''})"
        if not (root / path).exists():
            LOG.warning("Doc file '%s' links to '../%s', which is not a file of the repository", page.file.src_uri, path)
        return link["text"]

    return REPOSITORY_LINK.sub(resolve, markdown)


def _root(config) -> Path:
    return Path(config.config_file_path).resolve().parent
