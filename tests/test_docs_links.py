"""Every relative link in README.md and docs/*.md points to a file that exists and, when it names an
anchor, to a heading (or an explicit ``<a id>``) of that file, by GitHub's anchor rules."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (links and headings there are not rendered)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub renders for a markdown file, duplicates numbered -1, -2, ... as it does."""
    seen: dict[str, int] = {}
    found = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        found.update(_HTML_ANCHOR.findall(line))
        match = _HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    links = []
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        links += [t for t in _LINK.findall(line) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]
    return links


def test_the_slug_rule_matches_githubs_on_the_cases_these_pages_use():
    assert github_slug("Quick start: search (`make demo`)") == "quick-start-search-make-demo"
    assert github_slug("The math quick start (`make demo TASK=math`)") == "the-math-quick-start-make-demo-taskmath"
    assert github_slug("Mean ± std, 3 seeds x GRPO / SO-GRPO") == "mean--std-3-seeds-x-grpo--so-grpo"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with this anchor in {dest.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)
