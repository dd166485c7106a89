"""``anchors_only``: GRPO on the anchor groups alone, the bar every WM method must clear."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wmrl.lazy import lazy
from wmrl.methods.base import Method, register_method

if TYPE_CHECKING:
    import torch
else:
    torch = lazy("torch")


@register_method
class AnchorsOnly(Method):
    """The same real executions as the WM methods (a random fraction of the sampled tasks), no WM:
    the other sampled tasks are not even generated."""

    name = "anchors_only"
    summary = "GRPO on the anchor groups alone (the WM methods' real executions, no world model)"
    uses_wm = False
    config_sections = ("anchors",)
    role = "baseline"

    def select_tasks(self, tasks: list, anchor_groups: torch.Tensor) -> tuple[list, torch.Tensor]:
        kept = [t for t, a in zip(tasks, anchor_groups.tolist(), strict=True) if a]
        return kept, torch.ones(len(kept), dtype=torch.bool)
