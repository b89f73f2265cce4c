"""Every relative link of the README, benchmarks/README.md and docs/ names a file that exists,
and a ``#fragment`` names a heading (GitHub's anchor of it) or an ``<a id>`` of that page:
pages are linked instead of repeated, so a renamed heading must not leave links dangling."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md",
                *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(page: Path) -> str:
    return FENCE.sub("", page.read_text(encoding="utf-8"))


def _anchor(heading: str) -> str:
    """GitHub's: lower case, punctuation other than ``-`` and ``_`` removed, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in HEADING.findall(_prose(page)):
        anchor = _anchor(heading)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found | set(re.findall(r'<a (?:name|id)="([^"]+)"', _prose(page)))


def test_anchor_follows_github() -> None:
    assert _anchor("Tenants: what a shared deployment must set") == \
        "tenants-what-a-shared-deployment-must-set"
    assert _anchor("`agentcompact run` and `watch`") == "agentcompact-run-and-watch"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(page)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {', '.join(broken)}"
