"""The README is the front door to the documentation pages: every relative link in it names a file that exists
(the site's own links are checked by `mkdocs build --strict`, which does not read the README)."""

from __future__ import annotations

import re

from tests.conftest import REPO


def test_every_relative_link_of_the_readme_names_a_file():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    targets = [match[1] for match in re.finditer(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)", text) if "://" not in match[1]]
    assert len(targets) > 10
    assert [target for target in targets if not (REPO / target).is_file()] == []
