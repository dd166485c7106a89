"""Outcome world models: predict the score of an executed program from its text, without running it.

Two kinds behind one interface (:class:`OutcomeModel`):

- :class:`EncoderOutcomeModel`: a small transformer encoder over ``task text + solution text`` with an
  ensemble of ``K`` independently initialised members trained on bootstrap-weighted data; the mean
  over members is the prediction, their spread (plus a floor) the variance (deep ensembles,
  Lakshminarayanan et al. 2017, arXiv:1612.01474).
- :class:`LMOutcomeModel`: a causal LM prompted for a structured prediction
  ``runs: yes|no; valid: yes|no; quality: 0-9``, sampled ``S`` times; each sample maps to a score
  (``failure_score`` if it does not run or is invalid, else ``lo + q / 9 * (hi - lo)``), and the
  samples' mean and variance are the prediction.

Both are trained first on an execution log (:class:`ExecutionLog`, JSONL on disk) and then refined
online (:meth:`OutcomeModel.update`): the new examples join the replay set and a few gradient steps
run on minibatches that always contain them. :func:`outcome_metrics` measures quality on held-out
executions: rank correlation, error and calibration of the variance.

This module knows nothing of the research domain: texts in, scores out. The LM kind takes any text
LM object with ``encode(prompts)``, ``sample(ids, mask, generator, max_new_tokens)`` and
``nll(prompts, completions)`` (``wmrl_research.policy.ResearchPolicy`` is one).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

# --------------------------------------------------------------------------------------------------
# Execution log


@dataclass
class OutcomeExample:
    """One executed program: ``reward`` is the normalised score; ``status`` optional ("ok", "crash",
    "timeout", "invalid", "rejected")."""

    task_id: str
    task_text: str
    solution_text: str
    reward: float
    status: str = ""
    source: str = ""  # "log" (initial), "anchor" (online), ...


class ExecutionLog:
    """An append-only JSONL file of :class:`OutcomeExample` records (a dataset on disk)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def append(self, examples: Sequence[OutcomeExample]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            for e in examples:
                f.write(json.dumps(asdict(e)) + "\n")

    def load(self) -> list[OutcomeExample]:
        if not self.path.exists():
            return []
        out = []
        with open(self.path) as f:
            for i, line in enumerate(f):
                if line.strip():
                    try:
                        out.append(OutcomeExample(**json.loads(line)))
                    except (json.JSONDecodeError, TypeError) as e:
                        raise ValueError(f"{self.path}:{i + 1}: not an execution record: {e}") from None
        return out

    def __len__(self) -> int:
        return len(self.load())


# --------------------------------------------------------------------------------------------------
# Quality


def outcome_metrics(mean: torch.Tensor, var: torch.Tensor | None, true: torch.Tensor) -> dict[str, float]:
    """Quality of predictions ``mean`` (``[N]``, variance ``var`` ``[N]`` or None) against ``true``.

    spearman / pearson: rank and linear correlation; mae / rmse: errors; with a variance,
    nll: mean Gaussian negative log-likelihood; cover_1s / cover_2s: fraction of true values within
    1 and 2 predicted standard deviations (0.683 / 0.954 when calibrated); z2: mean squared
    standardised error (1 when calibrated, above 1 when over-confident).
    """
    from scipy.stats import pearsonr, spearmanr

    m, t = mean.double().flatten(), true.double().flatten()
    if m.shape != t.shape or m.numel() < 2:
        raise ValueError(
            f"need matching predictions and targets with >= 2 entries, got {m.shape} and {t.shape}"
        )
    err = m - t
    out = {
        "n": float(m.numel()),
        "mae": float(err.abs().mean()),
        "rmse": float(err.pow(2).mean().sqrt()),
    }
    const = bool(m.std() == 0 or t.std() == 0)
    out["spearman"] = 0.0 if const else float(spearmanr(m.numpy(), t.numpy()).statistic)
    out["pearson"] = 0.0 if const else float(pearsonr(m.numpy(), t.numpy()).statistic)
    if var is not None:
        v = var.double().flatten().clamp(min=1e-6)
        z2 = err.pow(2) / v
        out["nll"] = float((0.5 * (v.log() + z2 + math.log(2 * math.pi))).mean())
        out["cover_1s"] = float((z2 <= 1).double().mean())
        out["cover_2s"] = float((z2 <= 4).double().mean())
        out["z2"] = float(z2.mean())
    return out


# --------------------------------------------------------------------------------------------------
# Interface and shared replay logic


class OutcomeModel(Protocol):
    def predict(
        self, task_texts: Sequence[str], solution_texts: Sequence[str]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean [N], var [N])`` predicted normalised scores."""
        ...

    def fit(self, examples: Sequence[OutcomeExample], steps: int) -> dict[str, float]:
        """Add ``examples`` to the training set and train ``steps`` steps on the whole set."""
        ...

    def update(self, examples: Sequence[OutcomeExample], steps: int) -> dict[str, float]:
        """Online refinement: add ``examples``; ``steps`` steps on minibatches that contain them."""
        ...


class _ReplayTrainer(nn.Module):
    """Holds the training set and runs minibatch steps; subclasses define ``_loss(indices)``."""

    def __init__(self, batch_size: int, lr: float, seed: int):
        super().__init__()
        self.batch_size = batch_size
        self.lr = lr
        self.examples: list[OutcomeExample] = []
        self.gen = torch.Generator().manual_seed(seed)
        self._opt: torch.optim.Optimizer | None = None

    @property
    def opt(self) -> torch.optim.Optimizer:
        if self._opt is None:
            self._opt = torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=self.lr)
        return self._opt

    def _add(self, examples: Sequence[OutcomeExample]) -> list[int]:
        start = len(self.examples)
        self.examples.extend(examples)
        return list(range(start, len(self.examples)))

    def _loss(self, idx: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def _steps(self, steps: int, must: list[int]) -> list[float]:
        if not self.examples:
            raise ValueError("no training examples")
        self.train()
        losses = []
        n = len(self.examples)
        for _ in range(steps):
            k = max(self.batch_size - len(must), 0)
            rand = torch.randint(n, (k,), generator=self.gen)
            idx = torch.cat([torch.tensor(must, dtype=torch.long), rand])[: max(self.batch_size, len(must))]
            loss = self._loss(idx)
            self.opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for p in self.parameters() if p.requires_grad], 1.0)
            self.opt.step()
            losses.append(float(loss.detach()))
        self.eval()
        return losses

    def fit(self, examples: Sequence[OutcomeExample], steps: int) -> dict[str, float]:
        self._add(examples)
        losses = self._steps(steps, [])
        return {"wm/fit_loss_first": losses[0] if losses else float("nan"), "wm/fit_loss": _tail(losses)}

    def update(self, examples: Sequence[OutcomeExample], steps: int) -> dict[str, float]:
        new = self._add(examples)
        # Each step sees (up to) a minibatch's worth of the new examples plus replay.
        must = new[-self.batch_size // 2 :] if new else []
        losses = self._steps(steps, must) if steps > 0 else []
        return {"wm/update_loss": _tail(losses), "wm/train_size": float(len(self.examples))}

    def extra_state(self) -> dict[str, Any]:
        return {
            "examples": [asdict(e) for e in self.examples],
            "gen": self.gen.get_state(),
            "opt": self._opt.state_dict() if self._opt is not None else None,
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.examples = [OutcomeExample(**e) for e in state["examples"]]
        self.gen.set_state(state["gen"])
        if state.get("opt") is not None:
            self.opt.load_state_dict(state["opt"])


def _tail(losses: list[float], k: int = 10) -> float:
    return float(sum(losses[-k:]) / len(losses[-k:])) if losses else float("nan")


# --------------------------------------------------------------------------------------------------
# (1) Encoder + ensemble regression head


class _EncoderMember(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, max_len: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        layer = nn.TransformerEncoderLayer(
            dim, heads, 2 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, 1))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # ids, mask: [B, L] -> [B]
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.enc(self.tok(ids) + self.pos(pos), src_key_padding_mask=~mask.bool())  # [B, L, D]
        m = mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1)  # [B, D]
        return self.head(pooled).squeeze(-1)


class EncoderOutcomeModel(_ReplayTrainer):
    """Ensemble of ``members`` small transformer encoders over the tokenised ``task \\n solution`` text.

    ``var = var_members(mean_m) + var_floor``. Each member weighs each training example by its own
    Poisson(1) bootstrap weight (fixed per example), so members disagree where data is thin.
    """

    def __init__(
        self,
        tokenizer,
        members: int = 4,
        dim: int = 64,
        layers: int = 2,
        heads: int = 4,
        max_len: int = 192,
        batch_size: int = 32,
        lr: float = 1e-3,
        var_floor: float = 1e-3,
        seed: int = 0,
    ):
        super().__init__(batch_size, lr, seed)
        if members < 1:
            raise ValueError(f"members={members} must be >= 1")
        # what save_pretrained writes to config.json
        self.arch = {"members": members, "dim": dim, "layers": layers, "heads": heads, "max_len": max_len,
                     "var_floor": var_floor}  # fmt: skip
        self.tokenizer = tokenizer
        self.max_len = max_len
        self.var_floor = var_floor
        self.n_members = members
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.members = nn.ModuleList(
                _EncoderMember(len(tokenizer), dim, layers, heads, max_len) for _ in range(members)
            )
        self.boot = torch.empty(members, 0)  # [K, n_examples] bootstrap weights
        # Post-hoc variance scale (fitted on held-out executions by `calibrate_variance`).
        self.var_scale = 1.0

    def _add(self, examples: Sequence[OutcomeExample]) -> list[int]:
        w = torch.poisson(torch.ones(self.n_members, len(examples)), generator=self.gen)
        self.boot = torch.cat([self.boot, w], 1)
        return super()._add(examples)

    def _encode(
        self, task_texts: Sequence[str], solution_texts: Sequence[str]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        for a, b in zip(task_texts, solution_texts, strict=True):
            rows.append(self.tokenizer(f"{a}\n{b}", add_special_tokens=False)["input_ids"][: self.max_len])
        width = max(1, max(len(r) for r in rows))
        ids = torch.full((len(rows), width), int(self.tokenizer.pad_token_id or 0), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
        mask[:, 0] = 1  # an empty text still attends to one position
        return ids, mask

    def _member_preds(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        dev = self.members[0].tok.weight.device  # the model's device (--device); texts encode on the CPU
        ids, mask = ids.to(dev), mask.to(dev)
        return torch.stack([m(ids, mask) for m in self.members])  # [K, B]

    def _loss(self, idx: torch.Tensor) -> torch.Tensor:
        ex = [self.examples[i] for i in idx.tolist()]
        ids, mask = self._encode([e.task_text for e in ex], [e.solution_text for e in ex])
        preds = self._member_preds(ids, mask)  # [K, B]
        y = torch.tensor([e.reward for e in ex], dtype=torch.float32, device=preds.device)
        w = self.boot[:, idx].to(preds.device)  # [K, B]
        return ((preds - y).pow(2) * w).sum() / w.sum().clamp(min=1)

    @torch.no_grad()
    def predict(
        self, task_texts: Sequence[str], solution_texts: Sequence[str], batch_size: int = 256
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.eval()
        means, vars_ = [], []
        for i in range(0, len(task_texts), batch_size):
            ids, mask = self._encode(task_texts[i : i + batch_size], solution_texts[i : i + batch_size])
            p = self._member_preds(ids, mask).cpu()  # [K, B]
            means.append(p.mean(0))
            spread = p.var(0, unbiased=False) if p.shape[0] > 1 else torch.zeros_like(p[0])
            vars_.append(self.var_scale * spread + self.var_floor)
        if not means:
            return torch.zeros(0), torch.zeros(0)
        return torch.cat(means), torch.cat(vars_)

    def calibrate_variance(self, examples: Sequence[OutcomeExample], max_scale: float = 100.0) -> float:
        """Scale the ensemble spread so that the mean squared error on ``examples`` (held-out
        executions) equals the mean predicted variance; returns the new scale."""
        self.var_scale = 1.0
        mean, var = self.predict([e.task_text for e in examples], [e.solution_text for e in examples])
        y = torch.tensor([e.reward for e in examples])
        spread = (var - self.var_floor).clamp(min=1e-8)
        excess = ((mean - y).pow(2) - self.var_floor).clamp(min=0)
        self.var_scale = float((excess.mean() / spread.mean()).clamp(1.0 / max_scale, max_scale))
        return self.var_scale

    def state_dict_full(self) -> dict[str, Any]:
        return {
            "params": self.state_dict(),
            "boot": self.boot,
            "var_scale": self.var_scale,
            **self.extra_state(),
        }

    def save_pretrained(self, path: str | Path) -> None:
        """``model.safetensors`` (the members' weights), ``config.json`` and the tokenizer in ``path``:
        what :meth:`predict` needs, without the replay data or the optimizer."""
        from safetensors.torch import save_model

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_model(self, str(path / "model.safetensors"))
        cfg = {"type": "encoder_outcome_model", **self.arch, "var_scale": self.var_scale}
        (path / "config.json").write_text(json.dumps(cfg, indent=2))
        self.tokenizer.save_pretrained(str(path))

    @classmethod
    def from_pretrained(cls, path: str | Path) -> EncoderOutcomeModel:
        """The model :meth:`save_pretrained` wrote (weights from safetensors, strictly), in eval mode."""
        from safetensors.torch import load_model
        from transformers import AutoTokenizer

        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        var_scale = float(cfg.pop("var_scale", 1.0))
        cfg.pop("type", None)
        model = cls(AutoTokenizer.from_pretrained(str(path)), **cfg)
        load_model(model, str(path / "model.safetensors"), strict=True)
        model.var_scale = var_scale
        return model.eval()

    def load_state_dict_full(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state["params"])
        self.boot = state["boot"]
        self.var_scale = float(state.get("var_scale", 1.0))
        self.load_extra_state(state)


# --------------------------------------------------------------------------------------------------
# (2) Causal LM prompted for a structured prediction

_ANSWER = re.compile(r"runs:\s*(yes|no);\s*valid:\s*(yes|no);\s*quality:\s*(\d)")


class TextLM(Protocol):
    def encode(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]: ...

    def sample(self, prompt_ids, prompt_mask, generator=None, max_new_tokens=None, greedy=False) -> Any: ...

    def nll(self, prompts: Sequence[str], completions: Sequence[str]) -> torch.Tensor: ...


class LMOutcomeModel(_ReplayTrainer):
    """A causal LM fine-tuned to answer ``runs: ..; valid: ..; quality: q`` and sampled ``samples`` times.

    Score of one answer: ``failure_score`` if ``runs`` or ``valid`` is "no", else
    ``lo + q / 9 * (hi - lo)``. Unparsable answers are dropped; a row with none left gets the
    training set's mean and variance.
    """

    def __init__(
        self,
        lm: TextLM,
        samples: int = 4,
        lo: float = -0.5,
        hi: float = 1.5,
        failure_score: float = -1.0,
        batch_size: int = 16,
        lr: float = 3e-3,
        var_floor: float = 1e-3,
        answer_tokens: int = 48,
        seed: int = 0,
    ):
        super().__init__(batch_size, lr, seed)
        self.answer_tokens = answer_tokens
        if samples < 1 or not hi > lo:
            raise ValueError(f"need samples >= 1 and hi > lo, got samples={samples}, lo={lo}, hi={hi}")
        self.lm = lm  # an nn.Module, so its parameters are trained and saved with this model
        self.samples, self.lo, self.hi = samples, lo, hi
        self.failure_score = failure_score
        self.var_floor = var_floor

    @staticmethod
    def prompt(task_text: str, solution_text: str) -> str:
        return f"Task: {task_text}\nSolution:\n{solution_text}\nOutcome:"

    def answer(self, reward: float, status: str = "") -> str:
        """The structured target for an executed example."""
        if reward <= self.failure_score + 1e-9:
            runs = "no" if status not in ("invalid",) else "yes"
            return f" runs: {runs}; valid: no; quality: 0"
        q = round(min(max((reward - self.lo) / (self.hi - self.lo), 0.0), 1.0) * 9)
        return f" runs: yes; valid: yes; quality: {q}"

    def score(self, text: str) -> float | None:
        m = _ANSWER.search(text)
        if m is None:
            return None
        if m.group(1) == "no" or m.group(2) == "no":
            return self.failure_score
        return self.lo + int(m.group(3)) / 9 * (self.hi - self.lo)

    def _loss(self, idx: torch.Tensor) -> torch.Tensor:
        ex = [self.examples[i] for i in idx.tolist()]
        prompts = [self.prompt(e.task_text, e.solution_text) for e in ex]
        return self.lm.nll(prompts, [self.answer(e.reward, e.status) for e in ex])

    @torch.no_grad()
    def predict(
        self, task_texts: Sequence[str], solution_texts: Sequence[str], batch_size: int = 64
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.eval()
        n = len(task_texts)
        if self.examples:
            prior = torch.tensor([e.reward for e in self.examples])
            prior_mean, prior_var = float(prior.mean()), float(prior.var(unbiased=False)) + self.var_floor
        else:
            prior_mean, prior_var = 0.0, 1.0
        prompts = [self.prompt(a, b) for a, b in zip(task_texts, solution_texts, strict=True)]
        rows = [p for p in prompts for _ in range(self.samples)]  # [N * S]
        scores: list[float | None] = []
        for i in range(0, len(rows), batch_size):
            ids, mask = self.lm.encode(rows[i : i + batch_size])
            out = self.lm.sample(ids, mask, self.gen, max_new_tokens=self.answer_tokens)
            scores += [self.score(t) for t in out.texts]
        mean, var = torch.full((n,), prior_mean), torch.full((n,), prior_var)
        for j in range(n):
            s = [x for x in scores[j * self.samples : (j + 1) * self.samples] if x is not None]
            if s:
                t = torch.tensor(s)
                mean[j] = t.mean()
                var[j] = t.var(unbiased=False) + self.var_floor
        return mean, var

    def state_dict_full(self) -> dict[str, Any]:
        return {"params": self.state_dict(), **self.extra_state()}

    def load_state_dict_full(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state["params"])
        self.load_extra_state(state)
