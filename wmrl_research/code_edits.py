"""Random free-form code edits of a solution: mutations outside the knobs block, as SEARCH/REPLACE text.

The knob log (``execution_logs.build_random_log``) only moves a program inside its knob space; a research
agent in ``free`` mode edits code. :func:`sample_code_edit` draws what such an agent might write, one
to ``max_mutations`` mutations of the lines outside the knobs block (and outside the module
docstring and imports), each drawn among the operators that apply to the program:

- ``drop``: a simple statement becomes ``pass`` (a dropped preprocessing step, a skipped
  ``optimizer.step()``; many of them crash, as a careless edit does);
- ``number``: a numeric literal scaled (x0, x0.1, x0.5, x2, x10; integers rounded, ``padding=1``
  -> ``padding=2``, ``momentum=0.9`` -> ``momentum=0.45``);
- ``string``: a string literal replaced by another one of the same program (``load("train")`` ->
  ``load("val")``, ``strategy="median"`` -> ``strategy="train"``);
- ``swap``: a name replaced by one of its family (``nn.ReLU`` -> ``nn.Tanh``, ``nn.MaxPool2d`` ->
  ``nn.AvgPool2d``, ``StandardScaler`` -> ``MinMaxScaler`` with its import, ``Ridge`` -> ``Lasso``,
  one imported estimator class for another, ``np.mean`` -> ``np.median``, ``cross_entropy`` ->
  ``nll_loss``, ...);
- ``operator``: an arithmetic or comparison operator swapped (``+``/``-``, ``*``/``/``,
  ``<``/``<=``, ...);
- ``loop``: a ``range(X)`` bound halved, doubled or set to 1;
- ``insert``: a line after the training data is loaded (half the training rows, Gaussian noise on
  the features, the rows shuffled, the training set doubled).

Operators are drawn with ``OPERATOR_WEIGHTS``. With probability ``knob_prob`` (0.5) a random knob edit (:func:`edits.sample_knob_edit`) joins the code
mutations, so knob and code changes interact. Every returned text applies in ``free`` mode and
parses as Python (:func:`sample_code_edit` retries until it does); whether it runs is what the
sandbox measures.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import random
import re
import time
import tokenize
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from wmrl_research.cache_keys import cache_key, data_key
from wmrl_research.edits import Edit, apply_edits, knobs_span, sample_knob_edit
from world_models.outcome import ExecutionLog

CODE_EDITS_VERSION = 2  # bump when the generator changes what a seed draws

OPERATORS = ("drop", "number", "string", "swap", "operator", "loop", "insert")
# Draw weights: the operators that mostly crash (drop, string, operator) less often than those that
# mostly move the score.
OPERATOR_WEIGHTS = (1, 3, 1, 3, 1, 2, 2)

# Families of interchangeable names (qualified as written in the tasks' code); an import line is
# added where the replacement needs one.
FAMILIES: tuple[tuple[str, ...], ...] = (
    ("nn.ReLU", "nn.Tanh", "nn.GELU", "nn.Sigmoid", "nn.ELU", "nn.Identity"),
    ("nn.MaxPool2d", "nn.AvgPool2d"),
    ("nn.MaxPool1d", "nn.AvgPool1d"),
    ("nn.RNN", "nn.GRU", "nn.LSTM"),
    ("torch.optim.Adam", "torch.optim.SGD", "torch.optim.AdamW", "torch.optim.RMSprop"),
    ("nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.multi_margin_loss"),
    ("np.mean", "np.median", "np.max", "np.min"),
    ("StandardScaler", "MinMaxScaler", "RobustScaler", "MaxAbsScaler"),
    ("Ridge", "Lasso", "LinearRegression", "ElasticNet"),
    ("LogisticRegression", "RidgeClassifier", "LinearSVC"),
    ("RandomForestClassifier", "ExtraTreesClassifier", "GradientBoostingClassifier"),
    ("RandomForestRegressor", "ExtraTreesRegressor", "GradientBoostingRegressor"),
    ("KNeighborsClassifier", "RadiusNeighborsClassifier"),
    ("SimpleImputer", "KNNImputer"),
)
IMPORTS = {
    "MinMaxScaler": "sklearn.preprocessing",
    "RobustScaler": "sklearn.preprocessing",
    "MaxAbsScaler": "sklearn.preprocessing",
    "StandardScaler": "sklearn.preprocessing",
    "Lasso": "sklearn.linear_model",
    "LinearRegression": "sklearn.linear_model",
    "ElasticNet": "sklearn.linear_model",
    "Ridge": "sklearn.linear_model",
    "RidgeClassifier": "sklearn.linear_model",
    "LogisticRegression": "sklearn.linear_model",
    "LinearSVC": "sklearn.svm",
    "ExtraTreesClassifier": "sklearn.ensemble",
    "GradientBoostingClassifier": "sklearn.ensemble",
    "RandomForestClassifier": "sklearn.ensemble",
    "ExtraTreesRegressor": "sklearn.ensemble",
    "GradientBoostingRegressor": "sklearn.ensemble",
    "RandomForestRegressor": "sklearn.ensemble",
    "KNeighborsClassifier": "sklearn.neighbors",
    "RadiusNeighborsClassifier": "sklearn.neighbors",
    "SimpleImputer": "sklearn.impute",
    "KNNImputer": "sklearn.impute",
}
SCALES = (0.0, 0.1, 0.5, 2.0, 10.0)
OPERATOR_SWAPS = {"+": "-", "-": "+", "*": "/", "/": "*", "//": "*", "<": "<=", "<=": "<", ">": ">=",
                  ">=": ">", "==": "!=", "!=": "=="}  # fmt: skip
LOOP_BOUNDS = ("max(1, ({}) // 2)", "2 * ({})", "1")
_TRAIN_LOAD = re.compile(r"^(?P<indent>\s*)(?P<x>\w+), (?P<y>\w+) = load\(\"train\"\)\s*$")
INSERTS = (
    "{x}, {y} = {x}[: len({x}) // 2], {y}[: len({y}) // 2]",
    "{x} = {x} + 0.5 * np.random.default_rng(0).standard_normal(np.shape({x}))",
    "_order = np.random.default_rng(1).permutation(len({x})); {x}, {y} = {x}[_order], {y}[_order]",
    "{x}, {y} = np.concatenate([{x}, {x}]), np.concatenate([{y}, {y}])",
)

Mutation = tuple[int, str]  # (0-based line index, new text of that line: may hold several lines)


def _editable_lines(source: str) -> list[int]:
    """0-based indices of code lines a mutation may touch: outside the knobs block, the module
    docstring and the imports; not blank, not a comment, not a ``def``/``class`` header."""
    lines = source.splitlines()
    lo, hi = knobs_span(source)
    knob_lo, knob_hi = source[:lo].count("\n"), source[:hi].count("\n")
    tree = ast.parse(source)
    skip = set()
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom) or (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        ):
            skip.update(range(node.lineno - 1, (node.end_lineno or node.lineno)))
    out = []
    for i, line in enumerate(lines):
        s = line.strip()
        if knob_lo <= i <= knob_hi or i in skip or not s or s.startswith(("#", "def ", "class ", "@")):
            continue
        out.append(i)
    return out


def _tokens(line: str) -> list[tokenize.TokenInfo]:
    try:
        return list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return []


def _replace_span(line: str, tok: tokenize.TokenInfo, new: str) -> str:
    indent = len(line) - len(line.lstrip())
    a, b = indent + tok.start[1], indent + tok.end[1]
    return line[:a] + new + line[b:]


def _drop(lines: list[str], i: int, rng: random.Random, ctx: dict[str, Any]) -> str | None:
    s = lines[i].strip()
    if s.endswith((":", "(", "[", ",")) or s.startswith(
        ("return", "else", "elif", "except", "finally", ")", "]")
    ):
        return None
    if s.startswith(("if ", "for ", "while ", "with ", "try")):
        return None
    if i + 1 < len(lines) and lines[i + 1].strip().startswith((")", "]", ".")):
        return None  # a statement continued on the next line
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    return indent + "pass"


def _number(lines: list[str], i: int, rng: random.Random, ctx: dict[str, Any]) -> str | None:
    toks = [t for t in _tokens(lines[i]) if t.type == tokenize.NUMBER]
    if not toks or 'f"' in lines[i] or "f'" in lines[i]:
        return None
    tok = rng.choice(toks)
    try:
        v = ast.literal_eval(tok.string)
    except (ValueError, SyntaxError):
        return None
    scale = rng.choice(SCALES)
    new = v * scale
    text = str(int(round(new))) if isinstance(v, int) else repr(float(new))
    if text == tok.string:
        return None
    return _replace_span(lines[i], tok, text)


def _string(lines: list[str], i: int, rng: random.Random, ctx: dict[str, Any]) -> str | None:
    toks = [t for t in _tokens(lines[i]) if t.type == tokenize.STRING and t.string[:1] in "\"'"]
    if not toks:
        return None
    tok = rng.choice(toks)
    others = [s for s in ctx["strings"] if s != tok.string]
    if not others:
        return None
    return _replace_span(lines[i], tok, rng.choice(others))


def _swap(lines: list[str], i: int, rng: random.Random, ctx: dict[str, Any]) -> str | None:
    line = lines[i]
    options = []
    for fam in FAMILIES:
        for name in fam:
            for m in re.finditer(r"(?<![\w.])" + re.escape(name) + r"(?!\w)", line):
                options.append((m, [n for n in fam if n != name]))
    # one imported estimator class for another of the same program (same module family)
    for m in re.finditer(r"(?<![\w.])([A-Z]\w+)(?=\()", line):
        peers = [c for c in ctx["classes"] if c != m.group(1) and c[-9:] == m.group(1)[-9:]]
        if m.group(1) in ctx["classes"] and peers:
            options.append((m, peers))
    if not options:
        return None
    m, choices = rng.choice(options)
    new = rng.choice(choices)
    out = line[: m.start()] + new + line[m.end() :]
    module = IMPORTS.get(new)
    if module and new not in ctx["imported"]:
        ctx["needs_import"].add((module, new))
    return out


def _operator(lines: list[str], i: int, rng: random.Random, ctx: dict[str, Any]) -> str | None:
    toks = [t for t in _tokens(lines[i]) if t.type == tokenize.OP and t.string in OPERATOR_SWAPS]
    if not toks or 'f"' in lines[i] or "f'" in lines[i]:
        return None
    tok = rng.choice(toks)
    return _replace_span(lines[i], tok, OPERATOR_SWAPS[tok.string])


def _loop(lines: list[str], i: int, rng: random.Random, ctx: dict[str, Any]) -> str | None:
    m = re.search(r"\brange\(([^(),]+)\)", lines[i])
    if not m:
        return None
    new = rng.choice(LOOP_BOUNDS).format(m.group(1).strip())
    return lines[i][: m.start(1)] + new + lines[i][m.end(1) :]


def _insert(lines: list[str], i: int, rng: random.Random, ctx: dict[str, Any]) -> str | None:
    m = _TRAIN_LOAD.match(lines[i])
    if not m:
        return None
    return lines[i] + "\n" + m.group("indent") + rng.choice(INSERTS).format(x=m.group("x"), y=m.group("y"))


MUTATORS: dict[str, Callable[[list[str], int, random.Random, dict[str, Any]], str | None]] = {
    "drop": _drop,
    "number": _number,
    "string": _string,
    "swap": _swap,
    "operator": _operator,
    "loop": _loop,
    "insert": _insert,
}


def _context(source: str) -> dict[str, Any]:
    tree = ast.parse(source)
    strings = sorted(
        {
            repr(n.value).replace("'", '"')
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and 0 < len(n.value) <= 20
            and "\n" not in n.value and '"' not in n.value and "\\" not in n.value
        }
    )  # fmt: skip
    imported = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            imported.update(a.asname or a.name for a in node.names)
    classes = sorted(n for n in imported if n[:1].isupper())
    return {"strings": strings, "imported": imported, "classes": classes, "needs_import": set()}


def _unique_search(lines: list[str], i: int, source: str) -> tuple[int, int]:
    """The smallest span of lines ``[a, b)`` around line ``i`` whose text occurs once in ``source``."""
    a, b = i, i + 1
    while source.count("\n".join(lines[a:b]) + "\n") != 1:
        if a > 0:
            a -= 1
        elif b < len(lines):
            b += 1
        else:
            break
    return a, b


def code_mutations(source: str, rng: random.Random, k: int) -> tuple[list[Mutation], set[tuple[str, str]]]:
    """Up to ``k`` mutations of distinct editable lines of ``source`` (operator uniform among those
    that apply, line uniform), and the ``(module, name)`` imports they need."""
    lines = source.splitlines()
    editable = _editable_lines(source)
    ctx = _context(source)
    out: list[Mutation] = []
    used: set[int] = set()
    for _ in range(20 * k):
        if len(out) == k:
            break
        op = rng.choices(OPERATORS, OPERATOR_WEIGHTS)[0]
        candidates = [i for i in editable if i not in used and i - 1 not in used and i + 1 not in used]
        rng.shuffle(candidates)
        for i in candidates[:40]:
            new = MUTATORS[op](lines, i, rng, ctx)
            if new is not None and new != lines[i]:
                out.append((i, new))
                used.add(i)
                break
    return out, ctx["needs_import"]


def render_code_edit(
    source: str, mutations: Sequence[Mutation], imports: set[tuple[str, str]] = frozenset()
) -> str:  # type: ignore[assignment]
    """SEARCH/REPLACE blocks that apply ``mutations`` (and the ``from module import name`` lines of
    ``imports``, after the program's last top-level import) to ``source``."""
    lines = source.splitlines()
    blocks = []
    for i, new in sorted(mutations):
        a, b = _unique_search(lines, i, source)
        old = "\n".join(lines[a:b]) + "\n"
        rep = "\n".join(lines[a:i] + [new] + lines[i + 1 : b]) + "\n"
        blocks.append(Edit(old, rep).render())
    if imports:
        tree = ast.parse(source)
        last = max(n.end_lineno or n.lineno for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom))
        anchor = last - 1
        a, b = _unique_search(lines, anchor, source)
        if b - 1 != anchor or any(a <= i < b for i, _ in mutations):
            return "\n".join(blocks)  # the import anchor is shared: leave the import out (the edit may crash)
        new_imports = [f"from {m} import {n}" for m, n in sorted(imports)]
        blocks.insert(
            0, Edit("\n".join(lines[a:b]) + "\n", "\n".join(lines[a:b] + new_imports) + "\n").render()
        )
    return "\n".join(blocks)


def sample_code_edit(
    source: str,
    rng: random.Random,
    max_mutations: int = 2,
    knob_space: Mapping[str, Sequence[Any]] | None = None,
    knob_prob: float = 0.5,
    tries: int = 50,
) -> str:
    """A random free-form edit of ``source`` (see the module docstring): SEARCH/REPLACE text that
    applies in ``free`` mode and leaves a program that parses. Raises ``ValueError`` if none is found
    in ``tries`` draws."""
    for _ in range(tries):
        k = rng.randint(1, max_mutations)
        mutations, imports = code_mutations(source, rng, k)
        if not mutations:
            continue
        text = render_code_edit(source, mutations, imports)
        if knob_space and rng.random() < knob_prob:
            text += "\n" + sample_knob_edit(source, knob_space, rng, 2)
        res = apply_edits(source, text, "free")
        if not res.ok or res.source is None:
            continue
        try:
            ast.parse(res.source)
        except SyntaxError:
            continue
        return text
    raise ValueError("no free-form edit of this source applied and parsed")


def random_code_sources(task: Any, n: int, rng: random.Random, max_mutations: int = 2) -> list[str]:
    """``n`` distinct edited sources of ``task``'s baseline by :func:`sample_code_edit` (fewer if the
    task's program offers fewer in ``20 * n`` draws)."""
    out: list[str] = []
    seen = {task.baseline_source}
    for _ in range(20 * n):
        if len(out) == n:
            break
        text = sample_code_edit(task.baseline_source, rng, max_mutations, task.knob_space)
        src = apply_edits(task.baseline_source, text, "free").source
        assert src is not None
        if src not in seen:
            seen.add(src)
            out.append(src)
    return out


def code_log_path(
    cache_dir: str | Path, train: Sequence[Any], per_task: int, seed: int, timeout_s: float
) -> Path:
    """The free-form-edit log's cache file, keyed like the knob log (``execution_logs.random_log_path``):
    the train tasks' definitions, size, seed, sandbox timeout, the generator and the data layout."""
    tasks = [
        (t.id, t.data_version, hashlib.sha256(t.baseline_source.encode()).hexdigest()[:12]) for t in train
    ]
    key = cache_key([tasks, per_task, seed, timeout_s, CODE_EDITS_VERSION, *data_key()])
    return Path(cache_dir) / f"code_log-{key}.jsonl"


def build_code_log(
    train: Sequence[Any], per_task: int, seed: int, timeout_s: float, executor, path: Path,
    chunk: int = 16, say: Callable[[str], None] = print,
) -> ExecutionLog:  # fmt: skip
    """Execute ``per_task`` random free-form edits of each train task's baseline
    (:func:`random_code_sources`, ``origin = "code"``) through ``executor`` and write them to the
    JSONL log at ``path``. Resumable: executions are appended to ``<path>.partial`` ``chunk`` jobs at
    a time with the count done in ``<path>.progress``; a rerun continues where the last one stopped,
    and the finished log is renamed to ``path`` with ``<path>.json`` holding its executions and
    seconds (apart from any RL budget). Ungraded executions (sandbox failures) are left out."""
    from wmrl.domain import Job
    from wmrl_research.domain import to_example
    from wmrl_research.grading import reward

    elog = ExecutionLog(path)
    if path.exists():
        return elog
    rng = random.Random(seed)
    owners = [(t, src) for t in train for src in random_code_sources(t, per_task, rng)]
    partial = ExecutionLog(path.with_suffix(".partial"))
    progress = path.with_suffix(".progress")
    done, seconds = 0, 0.0
    if progress.exists() and partial.path.exists():
        state = json.loads(progress.read_text())
        done, seconds = int(state["done"]), float(state["seconds"])
    else:
        partial.path.unlink(missing_ok=True)
    say(f"code log: {len(owners)} free-form edits, {done} executed before")
    while done < len(owners):
        part = owners[done : done + chunk]
        t0 = time.perf_counter()
        results = executor.run([Job(fn=reward, args=(t.id, src, timeout_s)) for t, src in part])
        seconds += time.perf_counter() - t0
        partial.append(
            [to_example(t, src, r.reward, "code") for (t, src), r in zip(part, results, strict=True) if r.reward == r.reward]
        )  # fmt: skip
        done += len(part)
        progress.write_text(json.dumps({"done": done, "seconds": seconds}))
        say(f"code log: {done}/{len(owners)} executed, {seconds:.0f}s")
    records = len(partial.load())
    info = {"executions": len(owners), "records": records, "seconds": seconds, "per_task": per_task,
            "seed": seed}  # fmt: skip
    path.with_suffix(".json").write_text(json.dumps(info, indent=2))
    partial.path.rename(path)
    progress.unlink(missing_ok=True)
    return elog
