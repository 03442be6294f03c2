"""Rewrite the generated build-config reference between the markers in README.md."""

from __future__ import annotations

from pathlib import Path

from pipeline.config.reference import BEGIN, END, config_reference_markdown

README = Path(__file__).resolve().parent.parent / "README.md"


def main() -> None:
    text = README.read_text()
    start, stop = text.index(BEGIN), text.index(END) + len(END) + 1
    README.write_text(text[:start] + config_reference_markdown() + text[stop:])


if __name__ == "__main__":
    main()
