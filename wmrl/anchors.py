"""Anchor-group selection: which groups of a step are executed for real.

Random and seeded: the choice at step ``t`` depends only on ``(seed, t)``, so a resumed run picks
exactly the groups an uninterrupted one would have picked. Training chooses uniformly;
:func:`inclusion_probabilities` is the design a WM-guided choice would use (anchors drawn with
unequal probabilities, weighted by ``1/π``), measured in ``benchmarks/vla_wm_quality.py``
(docs/results/vla.md, "Choosing the anchors with the world model").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wmrl.lazy import lazy

if TYPE_CHECKING:
    import torch
else:
    torch = lazy("torch")


def choose_anchor_groups(n_groups: int, k: int, seed: int, step: int) -> torch.Tensor:
    """``[n_groups]`` bool mask of the ``k`` anchor groups of training step ``step``, a uniform random
    subset (how many is the method's: ``Method.n_anchor_groups``)."""
    g = torch.Generator().manual_seed(hash_seed(seed, step, salt=0xA1C4))
    chosen = torch.randperm(n_groups, generator=g)[:k]
    mask = torch.zeros(n_groups, dtype=torch.bool)
    mask[chosen] = True
    return mask


def hash_seed(seed: int, step: int, salt: int) -> int:
    """A 63-bit seed derived from ``(seed, step, salt)`` (SplitMix64 finaliser)."""
    z = (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + salt) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF


def inclusion_probabilities(need: torch.Tensor, k: int, floor: float) -> torch.Tensor:
    """``[N]`` each group's probability of being an anchor, summing to ``k``: proportional to its
    ``need`` (capped at 1, the excess handed to the others), mixed with the uniform ``k/N``,

        π_t = (1 − floor) · min(1, c · need_t) + floor · k / N,     Σ_t π_t = k,

    so that ``π_t >= floor · k / N`` bounds the Horvitz-Thompson weights ``1/π_t`` by
    ``N / (floor · k)``. ``need`` ``[N]`` >= 0 (all zero, or ``floor = 1``: the uniform ``k/N``).
    """
    n = need.numel()
    if not 0 < k <= n:
        raise ValueError(f"k={k} anchor groups of {n}: need 0 < k <= {n}")
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"floor={floor} must lie in [0, 1]")
    need = need.double()
    if not bool(torch.isfinite(need).all()) or bool((need < 0).any()):
        raise ValueError(f"need must be finite and >= 0, got {need.tolist()}")
    uniform = torch.full((n,), k / n, dtype=torch.float64)
    if float(need.sum()) == 0.0:
        return uniform
    pps = torch.zeros(n, dtype=torch.float64)
    capped = torch.zeros(n, dtype=torch.bool)
    while True:  # proportional to need, the groups that would exceed 1 set to 1 (at most n rounds)
        free = ~capped & (need > 0)
        left = k - int(capped.sum())
        pps[free] = left * need[free] / need[free].sum() if free.any() else 0.0
        over = free & (pps > 1)
        if not over.any():
            break
        pps[over], capped = 1.0, capped | over
    short = k - float(pps.sum())  # only when fewer than k groups have any need: spread the rest
    if short > 1e-12:
        room = 1.0 - pps
        pps = pps + short * room / room.sum()
    return (1.0 - floor) * pps + floor * uniform
