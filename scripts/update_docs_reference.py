"""`make schema`: rewrite the documentation's generated parts from the code, each between its markers: the
build-config field reference (docs/reference.md) and the model-family support table (README.md, docs/targets.md)."""

from __future__ import annotations

from pathlib import Path

from pipeline.config.families import support_markdown
from pipeline.config.reference import BEGIN, END, config_reference_markdown

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_PAGE = ROOT / "docs" / "reference.md"
FAMILY_TABLE_PAGES = (ROOT / "README.md", ROOT / "docs" / "targets.md")
FAMILY_BEGIN = "<!-- BEGIN GENERATED FAMILY TABLE (pipeline.config.families.support_markdown) -->"
FAMILY_END = "<!-- END GENERATED FAMILY TABLE -->"


def replace_between(page: Path, begin: str, end: str, generated: str) -> None:
    """Replace what lies between the begin and end marker lines of the page (the markers stay)."""
    text = page.read_text(encoding="utf-8")
    start, stop = text.index(begin) + len(begin) + 1, text.index(end)
    page.write_text(text[:start] + generated + text[stop:], encoding="utf-8")


def main() -> None:
    reference = config_reference_markdown()  # carries its own markers
    replace_between(REFERENCE_PAGE, BEGIN, END, reference[len(BEGIN) + 1 : -len(END) - 1])
    for page in FAMILY_TABLE_PAGES:
        replace_between(page, FAMILY_BEGIN, FAMILY_END, support_markdown())


if __name__ == "__main__":
    main()
