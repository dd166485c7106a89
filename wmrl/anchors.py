"""Anchor-group selection: which groups of a step are executed for real.

Random and seeded: the choice at step ``t`` depends only on ``(seed, t)``, so a resumed run picks
exactly the groups an uninterrupted one would have picked.
"""

from __future__ import annotations

import torch


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
