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
  ``KNOBS_START`` and ``KNOBS_END`` marker lines), no REPLACE text may contain a marker, and the
  edited block must still consist of ``NAME = literal`` assignments (one per line, each NAME one of
  the block's knobs, each value accepted by ``ast.literal_eval``), so the fixed evaluation/IO code
  cannot change and a knob line cannot carry code (``C = 1.0; np.save = ...``). Meant for small
  models.
- ``"free"``: any exact edit of the file is allowed, as long as the edited file still parses as
  Python (a syntax error is rejected here rather than crashing in the sandbox). The knobs block may
  be edited too, or removed. ``--domain.edit_mode=free`` trains the agent in this mode.
"""

from __future__ import annotations

import ast
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


def check_knobs_block(block: str, names: set[str] | None = None) -> None:
    """Raise :class:`EditError` unless ``block`` holds only ``NAME = literal`` lines (comments and
    blank lines aside): one assignment per line, to a plain name (one of ``names`` when given), of a
    value that ``ast.literal_eval`` accepts. What knobs mode allows an edit to leave behind."""
    try:
        tree = ast.parse(block)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise EditError(f"knobs block is not valid Python after the edit: {getattr(e, 'msg', e)}") from None
    lines: set[int] = set()
    for st in tree.body:
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)):
            raise EditError(f"knobs block line {st.lineno}: only `NAME = literal` assignments are allowed")
        name = st.targets[0].id
        if names is not None and name not in names:
            raise EditError(f"knobs block line {st.lineno}: {name!r} is not one of the task's knobs")
        try:
            ast.literal_eval(st.value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            raise EditError(f"knob {name}: its value is not a literal (line {st.lineno})") from None
        span = set(range(st.lineno, (st.end_lineno or st.lineno) + 1))
        if span & lines:
            raise EditError(f"knobs block line {st.lineno}: one knob per line")
        lines |= span


def check_parses(source: str) -> None:
    """Raise :class:`EditError` unless ``source`` parses as Python (what free mode asks of an edit)."""
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        raise EditError(f"the edited solution is not valid Python: {getattr(e, 'msg', e)}{where}") from None


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
        names: set[str] = set()
        if mode == "knobs":
            start, end = _markers(start, end)
            names = set(parse_knobs(knobs_block(source, start, end)))
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
        if mode == "knobs":
            check_knobs_block(knobs_block(source, start, end), names)
        else:
            check_parses(source)
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


def randomise_knobs(
    source: str,
    knob_space: Mapping[str, Sequence[Any]],
    rng: random.Random,
    p: float = 0.5,
    start: str | None = None,
    end: str | None = None,
) -> str:
    """``source`` with each knob (independently, with probability ``p``) set to a random value of its
    space: another starting point of the same task, so SFT cannot memorise the current values."""
    current = parse_knobs(knobs_block(source, start, end))
    changes = {
        k: rng.choice(list(vs)) for k, vs in knob_space.items() if k in current and vs and rng.random() < p
    }
    changes = {k: v for k, v in changes.items() if format_value(v) != current[k]}
    if not changes:
        return source
    res = apply_edits(source, knob_edit(source, changes, start, end), "knobs", start, end)
    return res.source if res.ok else source


# --------------------------------------------------------------------------------------------------
# Synthetic knobs blocks: SFT data that teaches the edit format, not the training tasks' lines

_NAME_PARTS = (
    "MODEL METHOD MODE KIND TYPE LR LEARNING RATE ALPHA BETA GAMMA LAMBDA C EPS TOL MAX MIN N NUM "
    "DEPTH WIDTH HIDDEN UNITS LAYERS HEADS CHANNELS KERNEL STRIDE POOL DROPOUT DECAY WEIGHT EPOCHS "
    "STEPS ITER BATCH SIZE SCALE NORM CLIP WARMUP MOMENTUM OPTIMIZER LOSS SEED SPLIT FOLDS NEIGHBORS "
    "ESTIMATORS LEAVES TREES FEATURES LAGS SEASON WINDOW HORIZON DEGREE POLY LOG TARGET CLASS "
    "THRESHOLD SMOOTH TEMPERATURE PENALTY SOLVER KERNEL GRID BINS RANK RATIO FRACTION SAMPLES "
    "EMBED DIM ACTIVATION SCHEDULE RELATIVE BALANCE AUGMENT"
).split()
_WORDS = (
    "ridge lasso knn forest hgb svm logreg mlp cnn rnn gru lstm sgd adam adamw rmsprop relu gelu "
    "tanh linear rbf poly naive drift seasonal mean median mode constant balanced auto sqrt log2 "
    "uniform distance cosine step none l1 l2 elasticnet gini entropy huber squared absolute quantile "
    "standard minmax robust lbfgs saga newton adagrad exp plateau onecycle"
).split()
_KINDS = (
    "tabular-classification tabular-regression ts-forecasting ts-classification image-classification "
    "sequence-classification imbalanced-classification text-classification anomaly-detection ranking"
).split()
_METRICS = (("accuracy", 1), ("f1", 1), ("macro_f1", 1), ("auc", 1), ("r2", 1), ("rmse", -1),
            ("mae", -1), ("log_loss", -1), ("mape", -1))  # fmt: skip
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_INTS = (1, 2, 3, 4, 5, 6, 8, 10, 11, 12, 15, 16, 20, 24, 30, 32, 40, 50, 64, 100, 128, 200, 256, 500, 1000)


def _random_name(rng: random.Random, taken: set[str]) -> str:
    while True:
        if rng.random() < 0.2:  # an unfamiliar identifier, so that copying (not recall) is learnt
            name = "".join(rng.choice(_LETTERS) for _ in range(rng.randint(1, 6)))
        else:
            name = "_".join(rng.choice(_NAME_PARTS) for _ in range(rng.choice((1, 1, 2, 2, 3))))
        if rng.random() < 0.1:
            name += str(rng.randint(0, 9))
        # no name may end another one: ``SAMPLES = 1`` would then occur twice after some edits
        if not any(a.endswith(b) for t in taken for a, b in ((name, t), (t, name))):
            taken.add(name)
            return name


def _random_choices(rng: random.Random) -> list[Any]:
    """2..6 distinct candidate values of one type, as a task's knob space lists them."""
    kind = rng.choice(("int", "int", "float", "float", "str", "str", "bool", "opt"))
    n = rng.randint(2, 6)
    if kind == "int":
        pool = sorted({rng.choice(_INTS) for _ in range(3 * n)})
        return pool[:n] if rng.random() < 0.5 else sorted(rng.sample(pool, min(n, len(pool))))
    if kind == "float":
        mant = (1.0, 2.0, 3.0, 5.0)
        pool = sorted({rng.choice(mant) * 10.0 ** rng.randint(-5, 3) for _ in range(3 * n)})
        pool = [float(f"{v:.6g}") for v in pool]
        if rng.random() < 0.3:
            pool = sorted({round(rng.choice((0.0, 0.1, 0.2, 0.25, 0.3, 0.5, 0.7, 0.9, 0.95, 0.99)), 2)
                           for _ in range(3 * n)})  # fmt: skip
        return pool[:n] if rng.random() < 0.5 else sorted(rng.sample(pool, min(n, len(pool))))
    if kind == "str":
        return rng.sample(_WORDS, n)
    if kind == "bool":
        return [False, True] if rng.random() < 0.7 else [True, False]
    inner = _random_choices(rng)
    return [None, *[v for v in inner if v is not None and not isinstance(v, bool)]][: max(2, n)]


@dataclass(frozen=True)
class SyntheticTask:
    """A made-up task with a random knobs block, in the real tasks' format (prompt and edits only;
    it cannot run). ``baseline_source`` has the knobs markers; every knob's value is in its space."""

    id: str
    kind: str
    metric: str
    direction: int
    knob_space: dict[str, list[Any]]
    baseline_source: str
    description: str = "A synthetic task (edit-format practice only)."
    split: str = "synthetic"


def synthetic_task(
    rng: random.Random,
    min_knobs: int = 2,
    max_knobs: int = 10,
    start: str | None = None,
    end: str | None = None,
) -> SyntheticTask:
    """A random task whose knobs block looks like the real ones: ``NAME = value  # comment`` lines
    (random upper-case identifiers; int, float, string, bool or optional values) and a knob space of
    2-6 candidates per knob that holds the current value."""
    start, end = _markers(start, end)
    taken: set[str] = set()
    space: dict[str, list[Any]] = {}
    lines = []
    for _ in range(rng.randint(min_knobs, max_knobs)):
        name = _random_name(rng, taken)
        choices = _random_choices(rng)
        space[name] = choices
        value = rng.choice(choices)
        comment = " ".join(rng.sample(_WORDS, rng.randint(1, 4)))
        lines.append(f"{name} = {format_value(value)}" + (f"  # {comment}" if rng.random() < 0.8 else ""))
    words = rng.sample(_WORDS, 2)
    metric, direction = rng.choice(_METRICS)
    tid = f"{words[0]}_{words[1]}_{rng.choice(('cls', 'reg', 'forecast', 'synth', 'cnn', 'rnn'))}"
    body = "\n".join(lines)
    source = (
        f'"""{tid}: synthetic solution."""\n\nimport numpy as np\n\n{start}\n{body}\n{end}\n\n\n'
        'def main():\n    print(np.zeros(1))\n\n\nif __name__ == "__main__":\n    main()\n'
    )
    return SyntheticTask(tid, rng.choice(_KINDS), metric, direction, space, source)
