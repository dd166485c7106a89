"""Every relative link in the repository's Markdown files resolves: the file exists and, for a
``#fragment`` into a Markdown file, the heading does (GitHub's anchor rules)."""

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_DIRS = {"runs", "node_modules", "__pycache__"}
# [text](target) or [text](target "title"); images too. The target stops at whitespace or ')'.
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`]*`")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def markdown_files(root: Path = ROOT) -> list[Path]:
    """The repository's Markdown files, leaving out hidden folders (.venv, .git) and run outputs."""
    return sorted(
        p
        for p in root.rglob("*.md")
        if not any(part.startswith(".") or part in SKIPPED_DIRS for part in p.relative_to(root).parts[:-1])
    )


def prose_lines(text: str, blank_code: bool = True) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked out (``blank_code``)."""
    lines, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append(INLINE_CODE.sub("", line) if blank_code else line)
    return lines


def links(text: str) -> list[str]:
    """Every link target in the prose of a Markdown text."""
    return [m.group(1) for line in prose_lines(text) for m in LINK.finditer(line)]


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.strip().lower()
    kept = "".join(
        c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM"
    )  # letters, digits, marks
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a Markdown text's headings, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(text, blank_code=False):
        m = HEADING.match(line)
        if not m:
            continue
        base = github_anchor(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    """The relative links of one Markdown file that do not resolve, each with the reason."""
    text = path.read_text(encoding="utf-8")
    bad = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
            continue
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text(encoding="utf-8")):
            bad.append(f"{target}: no heading with anchor #{fragment}")
    return bad


def test_the_checker_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "a.md").write_text(
        "# Top\n## The `vla_rl` grid: 4 seeds\n"
        "[ok](b.md) [ok](#top) [ok](#the-vla_rl-grid-4-seeds) [web](https://x.org/y)\n"
        "`[in code](nowhere.md)`\n```\n[in a fence](nowhere.md)\n```\n"
        "[gone](missing.md) [bad anchor](b.md#nope) [ok anchor](b.md#b-1)\n"
    )
    (tmp_path / "b.md").write_text("# B\n# B\n")
    assert broken_links(tmp_path / "a.md") == [
        "missing.md: no such file",
        "b.md#nope: no heading with anchor #nope",
    ]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_no_file_cites_a_design_file_outside_the_repository():
    """The design lives in docs/design.md; nothing points at a file beside the repository."""
    outside = ("DESIGN" + ".md", "../" + "shared", "/work/" + "shared")
    hits = [
        f"{p.relative_to(ROOT)}: {needle}"
        for p in ROOT.rglob("*")
        if p.is_file()
        and p.suffix in {".md", ".py", ".json", ".yaml", ".yml", ".toml", ".txt", ".html"}
        and not any(part.startswith(".") or part in SKIPPED_DIRS for part in p.relative_to(ROOT).parts)
        for needle in outside
        if needle in p.read_text(encoding="utf-8", errors="replace")
    ]
    assert hits == []


if __name__ == "__main__":  # python tests/test_docs_links.py: every broken link, one a line; status 1 if any
    problems = [
        f"{md.relative_to(ROOT)}: {problem}" for md in markdown_files() for problem in broken_links(md)
    ]
    print("\n".join(problems))
    raise SystemExit(1 if problems else 0)
