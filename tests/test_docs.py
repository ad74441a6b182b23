"""The README and docs/ link to files and headings that exist (GitHub's heading anchors)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", page.read_text(), re.M)}


def test_slug_follows_githubs_rule() -> None:
    assert slug("`make bench`: speed against transformers' Trainer") == "make-bench-speed-against-transformers-trainer"
    assert slug("Numbers") == "numbers"


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def numbers_rows() -> tuple[list[str], list[list[str]]]:
    """The summary table of docs/numbers.md: its header and rows as cells (`\\|` inside a cell kept)."""
    text = (ROOT / "docs" / "numbers.md").read_text()
    section = text.split("\n## Summary\n", 1)[1].split("\n## ", 1)[0]
    lines = [l for l in section.splitlines() if l.startswith("|") and not l.startswith("|---")]
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", l)[1:-1]] for l in lines]
    return cells[0], cells[1:]


COMMAND = re.compile(r"`(?:[A-Z_]+=\S+ )*(make|toolkit|python|bash) [^`]*`|`make [a-z-]+`|`(make|toolkit) [^`]+`")


def test_every_figure_in_numbers_names_its_command_and_date() -> None:
    header, rows = numbers_rows()
    assert header == ["what", "result", "command", "measured", "detail"] and len(rows) >= 10
    unnamed = [r[0] for r in rows if not COMMAND.search(r[2])]
    undated = [r[0] for r in rows if re.search(r"\d", r[1]) and not re.search(r"\b20\d\d-\d\d-\d\d\b", r[3])]
    assert not unnamed and not undated, (unnamed, undated)
    assert "see the page" not in " ".join(r[2] for r in rows)


def test_no_test_count_or_suite_time_is_typed_by_hand() -> None:
    """Counts and times of the suite are what `make test` prints, not README text."""
    text = (ROOT / "README.md").read_text()
    assert not re.search(r"\b\d{3,} tests\b|\btests in \d|suite[^.\n]*\d+m\d\ds|about \d+ minutes on 2 cores", text)


def test_readme_is_a_front_door() -> None:
    """The README is read in five minutes: at most about 250 lines; the rest lives in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
