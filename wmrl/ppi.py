"""Prediction-powered advantages: a WM correction that is unbiased for any world model.

PPI++ (Angelopoulos, Duchi & Zrnic, arXiv:2311.01453) applied to the policy gradient (docs/design.md
section 6). A step samples ``N`` tasks; a uniform random ``n`` of them are anchors (executed). With
``g(t)`` a task's full-execution gradient and ``ĝ(t)`` the one from (calibrated) WM scores,

    g_ppi = λ/N · Σ_{all t} ĝ(t)  +  1/n · Σ_{anchor t} ( g(t) − λ ĝ(t) ),     E[g_ppi] = E[g]  for every λ.

Per rollout this is an advantage (:func:`ppi_advantages`): a WM-only rollout gets ``λ Â``, an anchor
rollout ``λ Â + (N/n)(A − λ Â)``. With ``λ = 0`` it is GRPO on the anchors alone (``anchors_only``).

**λ.** The anchors are a random subset *of* the N scored tasks (not a disjoint labelled set as in
PPI++), so with ``σ² = Var g``, ``σ̂² = Var ĝ``, ``c = Cov(g, ĝ)``::

    Var g_ppi = (1/n) [σ² − (1 − n/N)(2λc − λ²σ̂²)]
    λ*        = c / σ̂²            (PPI++'s disjoint-set optimum is c / ((1 + n/N) σ̂²))
    Var(λ*) / Var(anchors alone) = 1 − (1 − n/N) ρ²

:class:`PowerTuner` estimates ``c`` and ``σ̂²`` from the anchor groups of *earlier* steps only (a
window of recent groups), so a step's ``λ`` is independent of its own correction term, and
cross-fits the calibration over two folds of that window so that its ``Â`` are out of sample, as a
step's own are. ``λ`` is 0 until a warm-up number of anchor groups. Advantages stand in for gradients: the per-rollout score-function directions are
taken as equal in size and uncorrelated with the WM's errors; with ``cfg.moments = "gradient"`` they
are not: the tuner keeps each anchor group's Gram matrix of per-rollout score directions (real rows
and their WM rows, :func:`wmrl.learner.score_directions`) and takes ``c``, ``σ̂²``, ``σ²`` on the
group gradients themselves (:func:`gradient_row_products`), which is what a twin group imagined on
predicted frames needs: its gradient points wherever the policy's features of those frames do.

**Twin groups** (a domain whose WM rollouts are not its real ones, e.g. imagined robot rollouts): an
anchor task has a real group (true rewards, ``A``) and an imagined twin (WM scores, ``Â``) whose
rollout j shares rollout j's sampling noise. The same formula holds per task: real rows get
``(N/n) A``, the twin's rows ``λ Â (1 − N/n)``, every other imagined row ``λ Â``.

**Missing values** (:func:`ppi_rows`). Whether a rollout is graded is a property of the rollout:
full execution would leave it ungraded too, so ``g(t)`` is the gradient of the task's graded rows
(a group with < 2 of them gives ``g(t) = 0``). The correction subtracts the task's *whole* WM
gradient ``λ ĝ(t)``: every WM row of an anchor task gets ``λ Â (1 − N/n)``, its paired real rollout
graded or not; a row whose WM score is missing is left out of ``ĝ`` on every draw alike. The
loss divides by the tokens of the step's WM stream (every rollout of the N tasks; for twins, the
imagined groups), a count that no anchor draw changes, so ``E[g_ppi]`` is the full-execution GRPO
gradient over that same denominator: exactly GRPO's when every rollout is graded, and GRPO's times
(graded tokens / all tokens) otherwise. ``n = 0`` anchors is refused (λĝ alone is biased).

**Shrinking λ** (:func:`shrink_lambda`, ``cfg.shrink_confidence``): λ's moments come from a finite
window, so ``λ`` is computed with a one-sided lower confidence bound of ``ρ`` (Fisher z) instead of
``ρ̂``: ``λ = λ̂ · max(0, ρ_lo) / ρ̂``, which leans on the WM only as far as the window shows it
correlates with the truth.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from wmrl.lazy import lazy
from wmrl.learner import group_advantages
from wmrl.method_config import PPIConfig

if TYPE_CHECKING:
    import torch
else:
    torch = lazy("torch")


def ppi_advantages(
    adv_true: torch.Tensor,
    true_used: torch.Tensor,
    adv_wm: torch.Tensor,
    wm_used: torch.Tensor,
    corrected: torch.Tensor,
    n_tasks: int,
    n_anchors: int,
    lam: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-rollout prediction-powered advantages.

        a_i = λ Â_i [wm_used_i] (1 − (N/n) [corrected_i])  +  (N/n) A_i [true_used_i]

    For shared rollouts (an anchor rollout is both executed and WM-scored) an anchor row is
    ``λ Â + (N/n)(A − λ Â)`` and a WM-only row ``λ Â``; over the uniform choice of ``n`` anchors of
    ``N`` tasks, ``E[a_i] = A_i`` (each row is an anchor with probability n/N).

    Args:
        adv_true: ``[R]`` advantages from true rewards (ignored where not ``true_used``).
        true_used: ``[R]`` bool: executed, graded, in a group with >= 2 graded rollouts.
        adv_wm: ``[R]`` advantages from calibrated WM scores (ignored where not ``wm_used``).
        wm_used: ``[R]`` bool: in the WM stream with a usable advantage.
        corrected: ``[R]`` bool: a WM-stream row of an anchor task (the anchor group's own row, or
            a twin's row), whether or not its paired real rollout was graded (module docstring).
        n_tasks, n_anchors: ``N`` and ``n >= 1``.
        lam: ``λ`` in [0, 1], a float or per row ``[R]``.
    Returns:
        advantages ``[R]`` and used ``[R]`` (``true_used | wm_used``).
    """
    lam_t = torch.as_tensor(lam, dtype=adv_wm.dtype)
    if not bool(((lam_t >= 0) & (lam_t <= 1)).all()):
        raise ValueError(f"ppi lambda must lie in [0, 1], got {lam}")
    if n_anchors < 1:
        raise ValueError(
            f"ppi needs at least one anchor group per step, got n_anchors={n_anchors} of {n_tasks} tasks "
            "(the WM alone would give a biased update)"
        )
    scale = n_tasks / n_anchors
    zero = torch.zeros_like(adv_wm)
    a_wm = torch.where(wm_used, lam_t * adv_wm, zero) * torch.where(corrected, 1.0 - scale, 1.0)
    a_true = torch.where(true_used, scale * adv_true, zero)
    return a_wm + a_true, true_used | wm_used


@dataclass
class PPIRows:
    """One step's per-row ppi quantities (``[R]`` each), from :func:`ppi_rows`."""

    adv: torch.Tensor  # the prediction-powered advantages
    used: torch.Tensor  # rows in the loss (true_used | wm_used)
    counted: torch.Tensor  # rows whose tokens the loss divides by: the WM stream, draw-independent
    corrected: torch.Tensor  # WM rows of anchor tasks, λÂ(1 − N/n)
    paired: torch.Tensor  # corrected rows whose paired real rollout is graded: λ's moments
    pair: torch.Tensor  # the real rollout each row is paired with (itself, or the one it stands for)
    adv_true: torch.Tensor
    adv_wm: torch.Tensor


def ppi_rows(
    r_true: torch.Tensor,
    r_wm: torch.Tensor,
    group_ids: torch.Tensor,
    group_anchor: torch.Tensor,
    real_row: torch.Tensor | None,
    n_tasks: int,
    lam: float | torch.Tensor,
    advantage: str = "grpo",
    std_eps: float = 1e-4,
) -> PPIRows:
    """A step's prediction-powered advantages from its rewards (what the trainer's ``ppi`` runs).

    Args:
        r_true: ``[R]`` true rewards, NaN off executed rows and on ungraded ones.
        r_wm: ``[R]`` (calibrated) WM scores, NaN where the WM gave none; a real row that another
            row stands for leaves the WM stream to it.
        group_ids: ``[R]`` in ``0 .. n_groups-1``.
        group_anchor: ``[n_groups]`` bool, the executed groups (the first ``n_tasks`` groups are the
            tasks', groups of twins are appended after them).
        real_row: ``[R]`` long, the real row a WM-only row stands for (a twin's), -1 on the rows
            that stand for themselves; or None (``RolloutBatch.real_row``).
        n_tasks: ``N``; ``n = group_anchor.sum() >= 1``.
        lam: ``λ``, a float or per row ``[R]``.
    """
    rows = torch.arange(group_ids.numel())
    real_row = real_row if real_row is not None else torch.full_like(rows, -1)
    stands_in = real_row >= 0  # WM-only rows standing for a real rollout (twins)
    pair = torch.where(stands_in, real_row, rows)
    stood_for = torch.zeros_like(stands_in)
    stood_for[real_row[stands_in]] = True
    wm_stream = ~stood_for
    adv_true, true_used = group_advantages(r_true, group_ids, advantage, std_eps)
    r_wm = torch.where(wm_stream, r_wm, torch.full_like(r_wm, float("nan")))
    adv_wm, wm_used = group_advantages(r_wm, group_ids, advantage, std_eps)
    corrected = (group_anchor[group_ids] | stands_in) & wm_used
    n_anchors = int(group_anchor.sum())
    adv, used = ppi_advantages(adv_true, true_used, adv_wm, wm_used, corrected, n_tasks, n_anchors, lam)
    paired = corrected & true_used[pair]
    return PPIRows(adv, used, wm_stream, corrected, paired, pair, adv_true, adv_wm)


def anchor_moments(
    adv_true: torch.Tensor, adv_wm: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per anchor group ``k``: ``(Σ A·Â, Σ Â², Σ A²)``, each ``[K]``, over its paired rows.

    Args: ``adv_true``, ``adv_wm`` ``[M]`` paired advantages of the anchors' rows (row j of the real
    group with row j of its WM scores); ``group_ids`` ``[M]`` in ``0 .. K-1``.
    Within-group advantages are centred, so these are a task's gradient covariance and variances
    under the equal-direction approximation of the module docstring.
    """
    k = int(group_ids.max().item()) + 1 if group_ids.numel() else 0
    a, h = adv_true.double(), adv_wm.double()

    def per_group(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(k, dtype=torch.float64).index_add_(0, group_ids, x)

    return per_group(a * h), per_group(h * h), per_group(a * a)


def gradient_row_products(adv_true: torch.Tensor, adv_wm: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """One group's moments on gradients, split over its rows: ``[m, 3]`` with row j

        [ Â_j ŝ_j·g,  Â_j ŝ_j·ĝ,  A_j s_j·g ],     g = Σ_j A_j s_j,   ĝ = Σ_j Â_j ŝ_j,

    so the columns sum to ``(g·ĝ, |ĝ|², |g|²)``. ``adv_true``, ``adv_wm`` ``[m]``; ``gram`` ``[2m, 2m]``
    is the Gram matrix of ``[s_1 .. s_m, ŝ_1 .. ŝ_m]`` (real rows' score directions, then their WM
    rows'). With orthonormal ``s_j = ŝ_j`` (``gram`` all identity blocks) it is ``[A Â, Â², A²]``,
    the advantage-space products.
    """
    m = adv_true.numel()
    if gram.shape != (2 * m, 2 * m):
        raise ValueError(f"gram has shape {tuple(gram.shape)}, expected ({2 * m}, {2 * m}) for {m} rows")
    a, h, gm = adv_true.double(), adv_wm.double(), gram.double()
    real_real, wm_real, wm_wm = gm[:m, :m], gm[m:, :m], gm[m:, m:]
    return torch.stack([h * (wm_real @ a), h * (wm_wm @ h), a * (real_real @ a)], dim=1)


def variance_ratio(cross: float, wm_sq: float, true_sq: float, lam: float, anchor_frac: float) -> float:
    """``Var g_ppi / Var(anchors alone) = 1 − (1 − n/N)(2λc − λ²σ̂²)/σ²`` (NaN when ``σ² = 0``)."""
    if true_sq <= 0:
        return float("nan")
    return 1.0 - (1.0 - anchor_frac) * (2 * lam * cross - lam**2 * wm_sq) / true_sq


def rho_lower_bound(rho: float, n_eff: float, confidence: float) -> float:
    """One-sided lower confidence bound of a correlation (Fisher z):

        ρ_lo = tanh(atanh(ρ̂) − z / sqrt(n_eff − 3)),     z = Φ⁻¹(confidence)

    ``n_eff``: the sample size of a simple correlation with the same degrees of freedom (a pooled
    within-group correlation of M rows in K groups: ``M − K + 1``). -1 when ``n_eff <= 3``."""
    if n_eff <= 3 or not math.isfinite(rho):
        return -1.0
    z = math.atanh(min(max(rho, -1 + 1e-12), 1 - 1e-12))
    from scipy.stats import norm  # seconds to import: on first use

    return math.tanh(z - norm.ppf(confidence) / math.sqrt(n_eff - 3))


def shrink_lambda(lam: float, rho: float, n_eff: float, confidence: float) -> float:
    """The power-tuned ``λ̂ = c/σ̂² = ρ̂ σ/σ̂`` taken at ``ρ``'s lower confidence bound instead of ``ρ̂``:

        λ = λ̂ · clip(ρ_lo / ρ̂, 0, 1)        (ρ_lo: :func:`rho_lower_bound`; λ = 0 when ρ̂ <= 0)

    So ``λ = 0`` while the window cannot tell ``ρ`` from 0 at ``confidence``, and ``λ → λ̂`` as
    ``n_eff`` grows; with ``ρ = 0`` a positive ``λ`` is drawn with probability ``1 − confidence``."""
    if lam <= 0 or not rho > 0:
        return 0.0
    return lam * min(1.0, max(0.0, rho_lower_bound(rho, n_eff, confidence) / rho))


class PowerTuner:
    """The power-tuned ``λ = clip(c / σ̂², 0, 1)`` from the last ``window_groups`` anchor groups of
    earlier steps, cross-fitted: the groups alternate between two folds, each fold's WM scores are
    calibrated by an isotonic map fitted on the other fold (when the trainer's calibration is in use),
    so every ``Â`` in the estimate is out of sample, as this step's are. Recomputing from raw
    ``(r̂, r)`` keeps ``λ`` in step with the current calibration instead of pooling advantages made
    under older ones. 0 until ``warmup_groups`` groups; ``cfg.lam`` fixes it.

    With ``cfg.var_bins > 1`` and a WM that reports its variance, ``λ`` is tuned per bin of that
    variance (quantile bins of the window's): ``λ_b = c_b / σ̂²_b``, so a rollout the WM is unsure
    of leans on the WM less. A row's ``λ`` depends only on its own WM output, never on which tasks
    are anchors, so the estimator stays unbiased.
    """

    def __init__(self, cfg: PPIConfig, advantage: str = "grpo", std_eps: float = 1e-4):
        self.cfg = cfg
        self.advantage, self.std_eps = advantage, std_eps
        # Per group: raw WM scores, true rewards, WM-reported variances (NaN when none), and the
        # score-direction gram of its real and WM rows (None unless cfg.moments == "gradient").
        self.groups: deque[tuple[list[float], list[float], list[float], list | None]] = deque(
            maxlen=cfg.window_groups
        )
        self.seen = 0  # groups observed so far; fixes each group's fold
        self._cached: tuple[tuple[int, bool], tuple[torch.Tensor, torch.Tensor]] | None = None

    def observe(
        self,
        r_hat: torch.Tensor,
        r_true: torch.Tensor,
        group_ids: torch.Tensor,
        var: torch.Tensor | None = None,
        gram: torch.Tensor | None = None,
    ) -> None:
        """Add anchor groups: raw WM scores, true rewards and (optional) WM variances of paired,
        graded rows (``[M]`` each), ``group_ids`` ``[M]`` in ``0 .. K-1``; groups of < 2 rows skipped.
        ``gram`` ``[2M, 2M]``: the Gram matrix of the rows' score directions, the M real rows' then
        their M WM rows' (needed with ``cfg.moments = "gradient"``)."""
        if self.cfg.moments == "gradient" and gram is None:
            raise ValueError("ppi.moments=gradient: observe needs the rows' score-direction gram")
        var = torch.full_like(r_hat, float("nan")) if var is None else var
        for k in range(int(group_ids.max().item()) + 1 if group_ids.numel() else 0):
            rows = group_ids == k
            if int(rows.sum()) >= 2:
                g = None
                if gram is not None:  # the group's real rows and their WM rows, in that order
                    both = torch.cat([rows, rows]).nonzero().squeeze(-1)
                    g = gram[both][:, both].tolist()
                self.groups.append((r_hat[rows].tolist(), r_true[rows].tolist(), var[rows].tolist(), g))
                self.seen += 1

    def _window_products(self, calibrate: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-fitted per-row ``[A·Â, Â², A²]`` ``[M, 3]`` over the window, and the rows' variances
        ``[M]`` (computed once per window state)."""
        key = (self.seen, calibrate)
        if self._cached is None or self._cached[0] != key:
            self._cached = (key, self._compute_window_products(calibrate))
        return self._cached[1]

    def _compute_window_products(self, calibrate: bool) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.seen - len(self.groups)  # the window's first group's index, for its fold
        folds = [[g for i, g in enumerate(self.groups) if (first + i) % 2 == f] for f in (0, 1)]
        products, variances = [], []
        for f, held_out in enumerate(folds):
            if not held_out:
                continue
            fit_on = folds[1 - f]
            r_hat = torch.tensor([x for g in held_out for x in g[0]], dtype=torch.float64)
            r_true = torch.tensor([x for g in held_out for x in g[1]], dtype=torch.float64)
            gid = torch.cat([torch.full((len(g[0]),), i) for i, g in enumerate(held_out)])
            if calibrate and fit_on:
                x = np.array([v for g in fit_on for v in g[0]])
                y = np.array([v for g in fit_on for v in g[1]])
                from sklearn.isotonic import IsotonicRegression  # seconds to import: on first use

                iso = IsotonicRegression(out_of_bounds="clip").fit(x, y)
                r_hat = torch.from_numpy(iso.predict(r_hat.numpy()))
            a, _ = group_advantages(r_true, gid, self.advantage, self.std_eps)
            h, _ = group_advantages(r_hat, gid, self.advantage, self.std_eps)
            if self.cfg.moments == "gradient":
                products.append(
                    torch.cat(
                        [
                            gradient_row_products(
                                a[gid == i], h[gid == i], torch.tensor(g[3], dtype=torch.float64)
                            )
                            for i, g in enumerate(held_out)
                        ]
                    )
                )
            else:
                products.append(torch.stack([a * h, h * h, a * a], dim=1))
            variances.append(torch.tensor([x for g in held_out for x in g[2]], dtype=torch.float64))
        return torch.cat(products), torch.cat(variances)

    def moments(self, calibrate: bool) -> tuple[float, float, float]:
        """Cross-fitted ``(c, σ̂², σ²)`` per group over the window (NaN when it is empty)."""
        if not self.groups:
            return float("nan"), float("nan"), float("nan")
        products, _ = self._window_products(calibrate)
        c, h, t = (products.sum(0) / len(self.groups)).tolist()
        return c, h, t

    def n_eff(self) -> float:
        """The window's effective sample size for ``ρ̂``: ``M − K + 1`` for ``M`` rows in ``K`` groups
        on advantages (within-group centred), ``K`` on gradients (one gradient per group)."""
        if self.cfg.moments == "gradient":
            return float(len(self.groups))
        return float(sum(len(g[0]) for g in self.groups) - len(self.groups) + 1)

    def _tuned(self, products: torch.Tensor, n_eff: float) -> float:
        """``clip(c/σ̂², 0, 1)`` from rows' ``[A·Â, Â², A²]`` products ``[M, 3]``, shrunk by
        :func:`shrink_lambda` when ``cfg.shrink_confidence`` is set."""
        c, h, t = products.sum(0).tolist()
        lam = min(1.0, max(0.0, c / h)) if h > 0 else 0.0
        if self.cfg.shrink_confidence is None:
            return lam
        rho = c / math.sqrt(h * t) if h > 0 and t > 0 else float("nan")
        return shrink_lambda(lam, rho, n_eff, self.cfg.shrink_confidence)

    def shrink_factor(self, calibrate: bool) -> float:
        """``λ / λ̂`` of the global ``λ``: ``clip(ρ_lo / ρ̂, 0, 1)`` (1 without shrinkage; NaN before
        the warm-up or with a fixed ``λ``)."""
        if self.cfg.lam is not None or self.seen < self.cfg.warmup_groups:
            return float("nan")
        if self.cfg.shrink_confidence is None:
            return 1.0
        c, h, t = self._window_products(calibrate)[0].sum(0).tolist()
        rho = c / math.sqrt(h * t) if h > 0 and t > 0 else float("nan")
        return shrink_lambda(1.0, rho, self.n_eff(), self.cfg.shrink_confidence)

    def lam(self, calibrate: bool, var: torch.Tensor | None = None) -> torch.Tensor | float:
        """The global ``λ``; with ``var`` (``[R]``, the rows' WM variances) and ``cfg.var_bins > 1``,
        per-row ``λ`` ``[R]`` from the bin each row's variance falls in (a bin's ``n_eff`` is its
        share of the window's rows times the window's)."""
        if self.cfg.lam is not None:
            return self.cfg.lam
        if self.seen < self.cfg.warmup_groups:
            return 0.0
        products, w_var = self._window_products(calibrate)
        n_eff = self.n_eff()
        lam = self._tuned(products, n_eff)
        if var is None or self.cfg.var_bins <= 1 or not torch.isfinite(w_var).all():
            return lam
        edges = torch.quantile(w_var, torch.linspace(0, 1, self.cfg.var_bins + 1, dtype=torch.float64)[1:-1])
        bins = torch.bucketize(w_var, edges)
        per_bin = torch.full((self.cfg.var_bins,), lam, dtype=torch.float64)
        for b in range(self.cfg.var_bins):
            in_bin = bins == b
            if products[in_bin, 1].sum() > 0:
                per_bin[b] = self._tuned(products[in_bin], n_eff * float(in_bin.sum()) / len(bins))
        row_var = torch.where(torch.isfinite(var), var.double(), w_var.median())
        return per_bin[torch.bucketize(row_var, edges)].to(var.dtype)

    def state_dict(self) -> dict:
        return {"groups": [list(g) for g in self.groups], "seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        # a group saved before score-direction grams were kept has three fields
        groups = (tuple(g) if len(g) == 4 else (*g, None) for g in state["groups"])
        self.groups = deque(groups, maxlen=self.cfg.window_groups)
        self.seen = int(state["seen"])
        self._cached = None

    def metrics(self) -> dict[str, float]:
        """None of its own: the step's ``ppi/*`` metrics come with the advantages."""
        return {}
