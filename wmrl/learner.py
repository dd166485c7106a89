"""GRPO learner: pure functions for advantages and losses, and the optimizer step.

Shapes: ``N`` rollouts, ``T`` tokens per rollout; rewards are ``[N]`` with NaN marking an
ungraded rollout (excluded, never scored zero); ``group_ids`` ``[N]`` in ``0 .. n_groups-1``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from wmrl.advantages import ADVANTAGES
from wmrl.config import GRPOConfig
from wmrl.domain import RolloutBatch, log_probs
from wmrl.lazy import lazy

if TYPE_CHECKING:
    import torch
else:
    torch = lazy("torch")


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, kind: str = "grpo", std_eps: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """Within-group advantages over graded rollouts, of the registered kind ``kind``
    (:data:`wmrl.advantages.ADVANTAGES`, each a function of ``r_i - mean_g`` and ``std_g``):

    ``grpo``:    A_i = (r_i - mean_g) / (std_g + std_eps)   (DeepSeekMath, arXiv:2402.03300)
    ``dr_grpo``: A_i = r_i - mean_g                          (Dr.GRPO, arXiv:2503.20783)

    mean_g and std_g (population std, ddof=0) run over the graded rollouts (finite reward) of the
    group. A rollout is *used* when it is graded and its group has at least two graded rollouts;
    every other rollout gets advantage 0 and ``used = False``.

    Args:
        rewards: ``[N]`` float, NaN for ungraded.
        group_ids: ``[N]`` long.
    Returns:
        advantages ``[N]`` and used ``[N]`` bool.
    """
    if kind not in ADVANTAGES:
        raise ValueError(
            f"unknown advantage kind {kind!r}; expected one of {', '.join(map(repr, ADVANTAGES))}"
        )
    graded = torch.isfinite(rewards)
    r = torch.where(graded, rewards, torch.zeros_like(rewards)).double()
    n_groups = int(group_ids.max().item()) + 1 if group_ids.numel() else 0
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_ids, graded.double())
    total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_ids, r)
    mean = total / count.clamp(min=1)
    dev = torch.where(graded, r - mean[group_ids], torch.zeros_like(r))
    var = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_ids, dev**2) / count.clamp(min=1)
    adv = ADVANTAGES[kind](dev, var.sqrt()[group_ids], std_eps)
    used = graded & (count[group_ids] >= 2)
    adv = torch.where(used, adv, torch.zeros_like(adv))
    return adv.to(rewards.dtype), used


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    agg: str = "token_mean",
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    loss_denom: torch.Tensor | None = None,
    token_denom: torch.Tensor | None = None,
    anchor: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level clipped-ratio objective (PPO, arXiv:1707.06347) with an optional k3 KL term.

    Per token t of rollout i, with rho = exp(logp - old_logp):
        l_it = -min(rho * A_i, clip(rho, 1 - eps, 1 + eps) * A_i) + kl_coef * k3_it
        k3_it = exp(ref - logp) - (ref - logp) - 1   (Schulman's unbiased, non-negative KL estimate)
    Aggregation over real tokens (``mask``):
        ``token_mean``: sum_it m_it l_it / sum_it m_it
        ``seq_mean``:   mean_i (sum_t m_it l_it / sum_t m_it) over rollouts with >= 1 real token

    Args:
        logprobs, old_logprobs, mask: ``[N, T]``; ``ref_logprobs`` ``[N, T]`` or None.
        advantages: ``[N]``, already weighted (anchor weight w, per-sample weights); rollouts that
            must not contribute carry mask 0.
        loss_denom, token_denom: when this batch is one rank's share of a data-parallel batch, the
            whole batch's aggregation denominator (its real tokens for ``token_mean``, its rollouts
            with a real token for ``seq_mean``) and its real-token count, so that the shares' losses
            and diagnostics sum to the whole batch's. None: this batch's own.
        anchor: ``[N]`` bool or None: rows of anchor tasks. Given, the diagnostics also count the
            ratio-clipped tokens and the real tokens of anchor rows and of the others
            (``clipped_anchor``, ``tokens_anchor``, ``clipped_wm``, ``tokens_wm``: sums, not fractions).
    Returns:
        scalar loss and detached diagnostics (clip fraction, approx KL to the sampler, KL to ref).
    """
    if agg not in ("token_mean", "seq_mean"):
        raise ValueError(f"unknown loss aggregation {agg!r}; expected 'token_mean' or 'seq_mean'")
    mask = mask.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    adv = advantages.unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl_ref = torch.zeros_like(per_token)
    if ref_logprobs is not None and kl_coef > 0:
        d = ref_logprobs - logprobs
        kl_ref = torch.exp(d) - d - 1.0
        per_token = per_token + kl_coef * kl_ref
    loss = aggregate(per_token, mask, agg, loss_denom)
    with torch.no_grad():
        n = mask.sum().clamp(min=1) if token_denom is None else token_denom
        stats = {
            "clip_frac": (((ratio - 1.0).abs() > clip_eps).to(mask.dtype) * mask).sum() / n,
            "approx_kl": ((ratio - 1.0 - log_ratio) * mask).sum() / n,
            "kl_ref": (kl_ref * mask).sum() / n,
        }
        if anchor is not None:
            clipped_tokens = ((ratio - 1.0).abs() > clip_eps).to(mask.dtype) * mask
            for name, rows in (("anchor", anchor), ("wm", ~anchor)):
                keep = rows.to(mask.dtype).unsqueeze(-1)
                stats[f"clipped_{name}"] = (clipped_tokens * keep).sum()
                stats[f"tokens_{name}"] = (mask * keep).sum()
    return loss, stats


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, agg: str, denom: torch.Tensor | None = None
) -> torch.Tensor:
    """Masked mean of ``[N, T]`` values: over all real tokens (``token_mean``) or per rollout first.
    ``denom`` replaces the count divided by (a data-parallel share of a larger batch)."""
    if agg == "token_mean":
        return (per_token * mask).sum() / (mask.sum().clamp(min=1) if denom is None else denom)
    per_seq_tokens = mask.sum(-1)
    has = per_seq_tokens > 0
    per_seq = (per_token * mask).sum(-1) / per_seq_tokens.clamp(min=1)
    return per_seq[has].sum() / (has.sum().clamp(min=1) if denom is None else denom)


def aggregate_denom(mask: torch.Tensor, agg: str) -> torch.Tensor:
    """What :func:`aggregate` divides by for the whole of ``mask`` ``[N, T]``."""
    if agg == "token_mean":
        return mask.sum().clamp(min=1)
    return (mask.sum(-1) > 0).sum().clamp(min=1).to(mask.dtype)


def group_denoms(
    mask: torch.Tensor, group_ids: torch.Tensor, counted: torch.Tensor, agg: str
) -> torch.Tensor:
    """Each group's share of the loss's denominator, ``[n_groups]``: the real tokens (``token_mean``)
    or the rollouts with a real token (``seq_mean``) of its ``counted`` rows. A minibatch of groups
    divides by the sum of its groups' shares (at least 1), what :func:`aggregate_denom` gives for
    its counted rows. ``mask`` ``[N, T]``, ``group_ids`` and ``counted`` ``[N]``."""
    per_row = mask.sum(-1) if agg == "token_mean" else (mask.sum(-1) > 0).to(mask.dtype)
    per_row = torch.where(counted, per_row, torch.zeros_like(per_row))
    n_groups = int(group_ids.max().item()) + 1 if group_ids.numel() else 0
    return torch.zeros(n_groups, dtype=mask.dtype, device=mask.device).index_add_(0, group_ids, per_row)


def policy_gradient(
    policy: torch.nn.Module,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    used: torch.Tensor,
    cfg: GRPOConfig,
    counted: torch.Tensor | None = None,
) -> torch.Tensor:
    """The flattened gradient of the clipped loss at the current parameters (ratio = 1), ``[P]``: the
    gradient of :func:`grpo_update`'s first step with one minibatch (``counted`` as there).

    Used for diagnostics: the direction a method's update takes, compared across reward sources.
    """
    params = [p for p in policy.parameters() if p.requires_grad]
    keep = used.nonzero().squeeze(-1)
    sub = batch.select(keep)
    denom = group_denoms(batch.mask, batch.group_ids, used if counted is None else counted, cfg.loss_agg)
    logp = log_probs(policy, sub)
    loss, _ = clipped_policy_loss(
        logp,
        logp.detach(),
        advantages[keep],
        sub.mask,
        cfg.clip_eps,
        cfg.loss_agg,
        loss_denom=denom.sum().clamp(min=1),
    )
    return _flat_grad(loss, params)


def _flat_grad(y: torch.Tensor, params: list[torch.nn.Parameter]) -> torch.Tensor:
    """``∇_params y`` flattened into one ``[P]`` vector (zeros for parameters ``y`` does not use)."""
    grads = torch.autograd.grad(y, params, allow_unused=True)
    return torch.cat(
        [(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params, strict=True)]
    )


def score_directions(
    policy: torch.nn.Module, batch: RolloutBatch, rows: torch.Tensor, loss_agg: str
) -> torch.Tensor:
    """Per-rollout score-function directions at the current parameters, ``[M, P]`` for ``rows`` ``[M]``:

        s_i = ∇_θ Σ_t m_it log π(x_it)            (token_mean; every row shares the loss's denominator)
        s_i = ∇_θ (1/T_i) Σ_t m_it log π(x_it)     (seq_mean; T_i = Σ_t m_it)

    so that the loss gradient at ratio 1 is ``-(1/D) Σ_i a_i s_i`` with ``D`` the batch's common
    denominator: a group's gradient is ``Σ_j A_j s_j``. One forward and backward pass per row.
    """
    params = [p for p in policy.parameters() if p.requires_grad]
    out = torch.zeros(rows.numel(), sum(p.numel() for p in params), dtype=torch.float64)
    for k, i in enumerate(rows.tolist()):
        one = batch.select(torch.tensor([i])).to(params[0].device)
        logp = (log_probs(policy, one) * one.mask).sum()
        if loss_agg == "seq_mean":
            logp = logp / one.mask.sum().clamp(min=1)
        out[k] = _flat_grad(logp, params).double().cpu()
    return out


def grpo_update(
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    used: torch.Tensor,
    cfg: GRPOConfig,
    reference: torch.nn.Module | None = None,
    generator: torch.Generator | None = None,
    owned: torch.Tensor | None = None,
    accelerator=None,
    model: torch.nn.Module | None = None,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    counted: torch.Tensor | None = None,
    anchor: torch.Tensor | None = None,
) -> dict[str, float]:
    """``cfg.epochs`` passes over the batch in ``cfg.minibatches`` minibatches (split by group), each an
    optimizer step on the clipped loss, with gradient-norm clipping; a minibatch's gradient is
    accumulated over passes of at most ``cfg.micro_batch`` rollouts (:func:`_accumulate`). Returns
    averaged diagnostics over the steps taken.

    ``cfg.target_kl``: before each optimizer step but the first, a minibatch whose ``approx_kl`` (the
    k3 estimate of ``KL(π_old ‖ π_θ)`` under the current, pre-step policy) exceeds
    ``1.5 · target_kl`` ends the update, its step not taken (``loss/kl_stopped`` 1.0, and its
    ``approx_kl`` in ``loss/kl_at_stop``, NaN where the update ran to the end).

    ``autocast()`` wraps the policy's and the reference's forward passes (``--precision=bf16``); their
    log-probs are cast to float32 before the loss, and the backward pass runs outside it.

    ``counted`` ``[N]`` bool: the rows whose tokens a minibatch's loss divides by (:func:`group_denoms`;
    default the ``used`` rows). ``ppi`` counts every rollout of its WM stream, so that no anchor draw
    changes the denominator. ``anchor`` ``[N]`` bool: rows of anchor tasks; given, the diagnostics
    add ``clip_frac_anchor`` and ``clip_frac_wm`` (ratio-clipped tokens of those rows and of the
    others, over every optimizer step) beside ``grad_clipped`` (the share of steps whose gradient norm
    was clipped), which are always there.

    Data-parallel (``accelerator`` given): ``batch`` is the whole step on every rank and ``owned``
    ``[N]`` bool marks this rank's rows. The minibatches are the 1-process ones (same generator);
    each rank's loss covers its rows of a minibatch over the minibatch's global denominator, times
    the number of processes, and ``model`` (the accelerate-prepared :class:`wmrl.distributed.LogProbs`
    of ``policy``) averages the gradients, which is the whole minibatch's gradient (:class:`_Share`)."""
    keep = used.nonzero().squeeze(-1)
    if keep.numel() == 0:
        return {"loss/optimizer_steps": 0.0}
    counted = used if counted is None else counted
    denoms = group_denoms(batch.mask, batch.group_ids, counted, cfg.loss_agg)
    groups = batch.group_ids[used | counted].unique()  # a counted group may have no used row
    batch, advantages = batch.select(keep), advantages[keep]
    anchor = None if anchor is None else anchor[keep]
    share = _Share(policy, None if accelerator is None or owned is None else owned[keep], accelerator, model)
    ref_logp = share.reference_logprobs(reference, batch, cfg, autocast)
    params = [p for p in policy.parameters() if p.requires_grad]
    sums: dict[str, float] = {}
    n_steps, stopped, kl_at_stop = 0, False, float("nan")
    for _ in range(cfg.epochs):
        if stopped:
            break
        order = groups[torch.randperm(groups.numel(), generator=generator)]
        for chunk in torch.tensor_split(order, min(cfg.minibatches, groups.numel())):
            rows = torch.isin(batch.group_ids, chunk).nonzero().squeeze(-1)
            if rows.numel() == 0:  # only counted groups without a used row (on every rank alike)
                continue
            sel, idle = share.rows(rows)
            optimizer.zero_grad(set_to_none=True)
            stats = _accumulate(
                share, batch, sel, idle, advantages, ref_logp, anchor, cfg, autocast,
                loss_denom=denoms[chunk.to(denoms.device)].sum().clamp(min=1),
                token_denom=share.token_denom(batch.mask[rows]),
            )  # fmt: skip
            totals = share.totals(stats)  # summed over ranks: every rank takes the same decision
            if kl_exceeds(totals["approx_kl"], cfg.target_kl) and n_steps > 0:
                optimizer.zero_grad(set_to_none=True)
                stopped, kl_at_stop = True, totals["approx_kl"]
                break
            grad_norm = clip_gradients(params, cfg.max_grad_norm)
            optimizer.step()
            totals |= {
                "grad_norm": float(grad_norm),
                "grad_clipped": _was_clipped(grad_norm, cfg.max_grad_norm),
            }
            for k, v in totals.items():
                sums[k] = sums.get(k, 0.0) + v
            n_steps += 1
    out = _update_metrics(sums, n_steps)
    if cfg.target_kl is None:
        return out
    return out | {"loss/kl_stopped": float(stopped), "loss/kl_at_stop": kl_at_stop}


def kl_exceeds(approx_kl: float, target_kl: float | None) -> bool:
    """PPO's early-stop rule: ``approx_kl > 1.5 · target_kl`` (never with no target)."""
    return target_kl is not None and approx_kl > 1.5 * target_kl


def _accumulate(
    share: _Share,
    batch: RolloutBatch,
    sel: torch.Tensor,
    idle: bool,
    advantages: torch.Tensor,
    ref_logp: torch.Tensor | None,
    anchor: torch.Tensor | None,
    cfg: GRPOConfig,
    autocast: Callable[[], contextlib.AbstractContextManager],
    loss_denom: torch.Tensor,
    token_denom: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """One minibatch's gradient, accumulated into ``.grad`` over passes of at most
    ``cfg.micro_batch`` of its rows ``sel`` (all at once when None). Every pass divides by the
    minibatch's denominators (``loss_denom``; ``token_denom``, default its rows' real tokens), so the
    passes' losses, gradients and diagnostics sum to the whole minibatch's: the update is the same,
    up to floating-point order, and the autograd graph held is one pass's. Data-parallel, only the
    last pass synchronises the gradients (``no_sync`` before it), so ranks that hold different
    numbers of rows still meet once. Returns the summed ``loss`` and diagnostics (detached)."""
    size = sel.numel() if cfg.micro_batch is None else cfg.micro_batch
    passes = torch.split(sel, size)
    if token_denom is None and len(passes) > 1:
        token_denom = batch.mask[sel].sum().clamp(min=1)
    sums: dict[str, torch.Tensor] = {}
    for i, part in enumerate(passes):
        mb = batch.select(part)
        with share.accumulating(last=i == len(passes) - 1):
            with autocast():
                logp = share.log_probs(mb)
            loss, stats = clipped_policy_loss(
                logp.float(),
                mb.logprobs.float(),
                advantages[part],
                mb.mask,
                cfg.clip_eps,
                cfg.loss_agg,
                None if ref_logp is None else ref_logp[part],
                cfg.kl_coef,
                loss_denom=loss_denom,
                token_denom=token_denom,
                anchor=None if anchor is None else anchor[part],
            )
            if idle:
                loss, stats = loss * 0.0, {k: v * 0.0 for k, v in stats.items()}
            share.backward(loss)
        for k, v in {"loss": loss.detach(), **stats}.items():
            sums[k] = sums[k] + v if k in sums else v
    return sums


class _Share:
    """What one process computes of :func:`grpo_update`'s minibatches. One process: every row, its
    own forward and backward passes. Data-parallel (``accelerator``): its ``owned`` rows ``[N]``
    through ``model``, the loss times the number of processes so that DDP's average of the
    gradients is the whole minibatch's, and the diagnostics summed over the ranks; a rank without
    rows in a minibatch still takes part in the average with one row whose loss is multiplied by 0."""

    def __init__(self, policy: torch.nn.Module, owned: torch.Tensor | None, accelerator, model):
        self.policy, self.accelerator = policy, accelerator
        if accelerator is not None:
            assert owned is not None and model is not None, "data-parallel updates need owned and model"
        self.owned, self.model = owned, model

    def reference_logprobs(
        self,
        reference: torch.nn.Module | None,
        batch: RolloutBatch,
        cfg: GRPOConfig,
        autocast: Callable[[], contextlib.AbstractContextManager],
    ) -> torch.Tensor | None:
        """``[N, T]`` float32 log-probs of the rows under the frozen reference (KL on), of this
        rank's rows only when data-parallel (the others 0); None without a KL term."""
        if reference is None or cfg.kl_coef <= 0:
            return None
        if self.owned is None:
            with torch.no_grad(), autocast():
                return log_probs(reference, batch).float()
        ref_logp = torch.zeros_like(batch.logprobs, dtype=torch.float32)
        mine = self.owned.nonzero().squeeze(-1)
        if mine.numel():
            with torch.no_grad(), autocast():
                ref_logp[mine] = log_probs(reference, batch.select(mine)).to(ref_logp.dtype)
        return ref_logp

    def rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """The rows of a minibatch this process computes, and whether it is idle in it (its one
        stand-in row then counts for nothing)."""
        if self.owned is None:
            return rows, False
        mine = rows[self.owned[rows]]
        return (rows[:1], True) if mine.numel() == 0 else (mine, False)

    def log_probs(self, mb: RolloutBatch) -> torch.Tensor:
        return log_probs(self.policy, mb) if self.model is None else self.model(mb)

    def token_denom(self, minibatch_mask: torch.Tensor) -> torch.Tensor | None:
        """The whole minibatch's real tokens (data-parallel), for diagnostics that sum over ranks."""
        return None if self.accelerator is None else minibatch_mask.sum().clamp(min=1)

    def accumulating(self, last: bool) -> contextlib.AbstractContextManager:
        """Around a pass of a minibatch's gradient accumulation: data-parallel, every pass but the
        ``last`` keeps its gradient local (DDP's ``no_sync``); the last one averages them all."""
        if self.accelerator is None or last:
            return contextlib.nullcontext()
        return self.accelerator.no_sync(self.model)

    def backward(self, loss: torch.Tensor) -> None:
        if self.accelerator is None:
            loss.backward()
        else:
            self.accelerator.backward(loss * self.accelerator.num_processes)

    def totals(self, stats: dict[str, torch.Tensor]) -> dict[str, float]:
        """A step's diagnostics as floats, summed over the ranks when data-parallel."""
        if self.accelerator is None:
            return {k: float(v) for k, v in stats.items()}
        local = torch.stack([v.float() for v in stats.values()]).to(self.accelerator.device)
        total = self.accelerator.reduce(local, "sum").cpu()
        return dict(zip(stats, total.tolist(), strict=True))


def _was_clipped(grad_norm: torch.Tensor | float, max_norm: float) -> float:
    """1.0 when gradient-norm clipping shrank this step's gradient, else 0.0."""
    return float(max_norm > 0 and float(grad_norm) > max_norm)


def _update_metrics(sums: dict[str, float], n_steps: int) -> dict[str, float]:
    """``loss/*`` diagnostics: per-step averages, and the anchor and WM rows' clip fractions over all
    steps' tokens (NaN when there were none of those rows)."""
    counts = {k: sums.pop(k) for k in [k for k in sums if k.startswith(("clipped_", "tokens_"))]}
    out = {f"loss/{k}": v / max(n_steps, 1) for k, v in sums.items()}
    for name in ("anchor", "wm"):
        if f"tokens_{name}" in counts:
            tokens = counts[f"tokens_{name}"]
            out[f"loss/clip_frac_{name}"] = counts[f"clipped_{name}"] / tokens if tokens > 0 else float("nan")
    return out | {"loss/optimizer_steps": float(n_steps)}


def clip_gradients(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip the global gradient norm of ``params`` to ``max_norm`` (``<= 0``: no clipping); returns
    the norm before clipping."""
    if max_norm > 0:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    return torch.sqrt(
        sum(((p.grad.detach() ** 2).sum() for p in params if p.grad is not None), torch.zeros(()))
    )


def make_optimizer(params: list[torch.nn.Parameter], cfg: GRPOConfig) -> torch.optim.Optimizer:
    """AdamW, or plain SGD, over ``params`` with the config's learning rate and weight decay."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
