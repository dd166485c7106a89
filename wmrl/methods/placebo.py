"""``<method>_placebo``: a WM method's own code path on a world model that ranks nothing, a control
(docs/design.md section 7; the permutation itself is wmrl/controls.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wmrl.controls import placebo_groups, placebo_prediction
from wmrl.domain import Prediction, PriorGroups
from wmrl.lazy import lazy
from wmrl.methods.base import Control

if TYPE_CHECKING:
    import torch
else:
    torch = lazy("torch")


class Placebo(Control):
    """Wraps any WM method (``--wm_placebo=true``): every step the WM's predictions (score and
    variance together) are permuted within each group by a generator seeded from the run's seed and
    step alone, and so are the execution log's groups that start ppi's λ; everything else is the
    base method's own."""

    suffix = "placebo"
    label = "placebo"
    note = "`<method>_placebo`: its WM's scores permuted within each group"
    overrides = ("--wm_placebo=true",)

    def prediction(self, pred: Prediction, group_ids: torch.Tensor, seed: int, step: int) -> Prediction:
        return placebo_prediction(self.base.prediction(pred, group_ids, seed, step), group_ids, seed, step)

    def prior_groups(self, groups: PriorGroups, seed: int) -> PriorGroups:
        return placebo_groups(self.base.prior_groups(groups, seed), seed)
