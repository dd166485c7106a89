"""The agent's action format: exact search/replace blocks over a task's ``solution.py``.

A completion holds one or more blocks::

    <<<<<<< SEARCH
    MODEL = "ridge"
    =======
    MODEL = "forest"
    >>>>>>> REPLACE

Each SEARCH text must occur exactly once in the current source; blocks apply in order, each to the
result of the previous one. Applying is pure string work (microseconds), so a malformed or
out-of-bounds edit is rejected with a reason before any sandbox run.

Two modes:

- ``"knobs"``: every SEARCH text must lie inside the task's knobs block (strictly between the
  ``KNOBS_START`` and ``KNOBS_END`` marker lines) and no REPLACE text may contain a marker, so the
  fixed evaluation/IO code cannot change. Meant for small models.
- ``"free"``: any exact edit of the file is allowed. Meant for large models.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SEARCH = "<<<<<<< SEARCH"
DIVIDER = "======="
REPLACE = ">>>>>>> REPLACE"
MODES = ("knobs", "free")

_BLOCK = re.compile(
    r"<<<<<<< SEARCH\n(?P<search>.*?)\n?=======\n(?P<replace>.*?)\n?>>>>>>> REPLACE",
    re.DOTALL,
)
_KNOB_LINE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?P<value>.+?)\s*(#.*)?$")


class EditError(ValueError):
    """An edit that cannot be applied; the message is the reason."""


@dataclass(frozen=True)
class Edit:
    search: str
    replace: str

    def render(self) -> str:
        return f"{SEARCH}\n{self.search}\n{DIVIDER}\n{self.replace}\n{REPLACE}"


@dataclass(frozen=True)
class EditResult:
    """The outcome of applying a completion: ``source`` is the edited file when ``ok``."""

    ok: bool
    source: str | None
    reason: str = ""
    n_edits: int = 0


def _markers(start: str | None, end: str | None) -> tuple[str, str]:
    if start is None or end is None:
        from wmrl_research.tasks import KNOBS_END, KNOBS_START

        start, end = start or KNOBS_START, end or KNOBS_END
    return start, end


def parse_edits(text: str) -> list[Edit]:
    """The search/replace blocks of ``text``, in order; raises EditError if there are none.

    Text outside the blocks is ignored (a model may add a sentence), but a block whose markers are
    incomplete or an empty SEARCH text is an error.
    """
    edits = [Edit(m.group("search"), m.group("replace")) for m in _BLOCK.finditer(text)]
    if not edits:
        if SEARCH in text:
            raise EditError("unterminated search/replace block (missing ======= or >>>>>>> REPLACE)")
        raise EditError("no search/replace block found")
    if text.count(SEARCH) != len(edits):
        raise EditError(f"{text.count(SEARCH)} '<<<<<<< SEARCH' markers but {len(edits)} complete blocks")
    for i, e in enumerate(edits):
        if not e.search.strip():
            raise EditError(f"block {i}: empty SEARCH text")
    return edits


def knobs_span(source: str, start: str | None = None, end: str | None = None) -> tuple[int, int]:
    """Character offsets ``(lo, hi)`` of the knobs block body: from after the start-marker line to
    the beginning of the end-marker line."""
    start, end = _markers(start, end)
    i = source.find(start)
    if i < 0:
        raise EditError(f"source has no knobs start marker {start!r}")
    lo = source.find("\n", i)
    lo = len(source) if lo < 0 else lo + 1
    j = source.find(end, lo)
    if j < 0:
        raise EditError(f"source has no knobs end marker {end!r} after the start marker")
    hi = source.rfind("\n", 0, j) + 1
    return lo, max(hi, lo)


def knobs_block(source: str, start: str | None = None, end: str | None = None) -> str:
    """The text between the knob marker lines (without the markers)."""
    lo, hi = knobs_span(source, start, end)
    return source[lo:hi]


def parse_knobs(block: str) -> dict[str, str]:
    """``{name: value source}`` for each ``NAME = value`` line of a knobs block (comments dropped)."""
    out: dict[str, str] = {}
    for line in block.splitlines():
        m = _KNOB_LINE.match(line.strip())
        if m and not line.startswith((" ", "\t")):
            out[m.group("name")] = m.group("value")
    return out


def apply_edits(
    source: str,
    text: str,
    mode: str = "knobs",
    start: str | None = None,
    end: str | None = None,
) -> EditResult:
    """Apply the blocks of ``text`` to ``source`` under ``mode``; never raises on a bad edit."""
    if mode not in MODES:
        raise ValueError(f"edit mode {mode!r} is not one of {', '.join(MODES)}")
    try:
        edits = parse_edits(text)
        if mode == "knobs":
            start, end = _markers(start, end)
        for i, e in enumerate(edits):
            n = source.count(e.search)
            if n == 0:
                raise EditError(f"block {i}: SEARCH text not found in the solution")
            if n > 1:
                raise EditError(f"block {i}: SEARCH text occurs {n} times (must be unique)")
            pos = source.index(e.search)
            if mode == "knobs":
                lo, hi = knobs_span(source, start, end)
                if pos < lo or pos + len(e.search) > hi:
                    raise EditError(f"block {i}: edits outside the knobs block (mode 'knobs')")
                if start in e.replace or end in e.replace:
                    raise EditError(f"block {i}: REPLACE text contains a knobs marker")
            source = source[:pos] + e.replace + source[pos + len(e.search) :]
        return EditResult(True, source, "", len(edits))
    except EditError as err:
        return EditResult(False, None, str(err), 0)


def format_value(value: Any) -> str:
    """A knob value as Python source: strings double-quoted, everything else ``repr``."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def knobs_view(source: str, start: str | None = None, end: str | None = None) -> str:
    """The knobs block as ``NAME = value`` lines, comments dropped (the compact view in prompts)."""
    return "".join(f"{k} = {v}\n" for k, v in parse_knobs(knobs_block(source, start, end)).items())


def knob_edit(
    source: str, changes: Mapping[str, Any], start: str | None = None, end: str | None = None
) -> str:
    """A completion (one block per changed knob) that sets each knob of ``changes`` in ``source``.

    The SEARCH text is the compact ``NAME = value`` (as :func:`knobs_view` shows it) where that is
    unique in the source, else the knob's whole line.
    """
    block = knobs_block(source, start, end)
    lines, values = {}, {}
    for line in block.splitlines():
        m = _KNOB_LINE.match(line.strip())
        if m and not line.startswith((" ", "\t")):
            lines[m.group("name")], values[m.group("name")] = line, m.group("value")
    blocks = []
    for name, value in changes.items():
        if name not in lines:
            raise KeyError(f"knob {name!r} is not in the knobs block (knobs: {', '.join(lines)})")
        short = f"{name} = {values[name]}"
        old = short if source.count(short) == 1 else lines[name]
        blocks.append(Edit(old, f"{name} = {format_value(value)}").render())
    return "\n".join(blocks)


def sample_knob_edit(
    source: str,
    knob_space: Mapping[str, Sequence[Any]],
    rng: random.Random,
    max_changes: int = 2,
    start: str | None = None,
    end: str | None = None,
) -> str:
    """A random valid knobs-mode completion: 1..``max_changes`` knobs set to a value that differs
    from the current one (knobs whose space offers no other value are skipped)."""
    current = parse_knobs(knobs_block(source, start, end))
    options = {
        k: [v for v in vs if format_value(v) != current.get(k)]
        for k, vs in knob_space.items()
        if k in current
    }
    options = {k: vs for k, vs in options.items() if vs}
    if not options:
        raise ValueError("knob space offers no value different from the current knobs")
    names = [n for n in current if n in options]  # block order
    k = rng.randint(1, min(max_changes, len(names)))
    chosen = sorted(rng.sample(names, k), key=names.index)
    return knob_edit(source, {n: rng.choice(options[n]) for n in chosen}, start, end)
