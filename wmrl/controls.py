"""The placebo world model: a control that runs a WM method's own code path on scores that carry no
information about which rollout of a group is better (docs/design.md section 7).

Each step the WM's predictions (score and reported variance, as a pair) are permuted within each
group by a generator seeded from ``(run seed, step)`` alone, so a resumed run draws the same
permutation and no other random stream of the run (task sampling, generation, anchors, the update,
the WM's own noise) is touched. The execution log's groups that start ppi's λ window
(``ppi.prior_from_log``) are permuted the same way, so no part of the run sees the WM's ranking. The multiset of a group's scores is unchanged, so the scale and
spread the method sees are the WM's; only the pairing of score and rollout is destroyed. A WM
method that beats ``anchors_only`` but not its placebo gains from something other than the WM's
ranking (e.g. extra WM rows in the loss's normalisation, or the anchors' own up-weighting).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wmrl.anchors import hash_seed
from wmrl.domain import Prediction
from wmrl.lazy import lazy

if TYPE_CHECKING:
    import torch
else:
    torch = lazy("torch")

PLACEBO_SALT = 0x9A1C3B0
PRIOR_SALT = 0x9A1C3B1  # the execution log's groups (ppi.prior_from_log), one draw per group


def within_group_permutation(group_ids: torch.Tensor, seed: int, step: int) -> torch.Tensor:
    """``[R]`` long: row ``i`` takes the prediction of row ``perm[i]``, a uniform random row of the
    same group (a uniform permutation within each group), seeded by ``(seed, step)``.

    Sorting rows by ``group id + u`` with ``u ~ U[0, 1)`` orders them by group, randomly within it;
    the rows in stable group order receive them position by position.
    """
    gen = torch.Generator().manual_seed(hash_seed(seed, step, salt=PLACEBO_SALT))
    keys = group_ids.double() + torch.rand(group_ids.shape, generator=gen, dtype=torch.float64)
    perm = torch.empty_like(group_ids, dtype=torch.long)
    perm[torch.argsort(group_ids, stable=True)] = torch.argsort(keys)
    return perm


def placebo_prediction(pred: Prediction, group_ids: torch.Tensor, seed: int, step: int) -> Prediction:
    """``pred`` with its rows permuted within each group (``within_group_permutation``); a row's
    score and variance move together."""
    perm = within_group_permutation(group_ids, seed, step)
    return Prediction(pred.mean[perm], None if pred.var is None else pred.var[perm])


def placebo_groups(
    groups: list[tuple[list[float], list[float]]], seed: int
) -> list[tuple[list[float], list[float]]]:
    """Prior anchor groups ``(WM scores, true rewards)`` with each group's WM scores permuted (group
    ``k`` by a generator seeded from ``(seed, k)``); the true rewards stay in place."""
    out = []
    for k, (r_hat, r_true) in enumerate(groups):
        gen = torch.Generator().manual_seed(hash_seed(seed, k, salt=PRIOR_SALT))
        perm = torch.randperm(len(r_hat), generator=gen).tolist()
        out.append(([r_hat[i] for i in perm], list(r_true)))
    return out
