"""Group advantage kinds: a registry of pure functions, the one place a kind is defined (the config's
``grpo.advantage`` names one, :func:`wmrl.learner.group_advantages` applies it).

Each kind maps a rollout's centred reward and its group's spread to its advantage, elementwise over
``[N]`` float64 tensors: ``dev_i = r_i - mean_g`` and ``std_g`` (population std, ddof=0) over the
graded rollouts of rollout ``i``'s group ``g``. This module imports no torch (the config reads it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

AdvantageKind = Callable[["Tensor", "Tensor", float], "Tensor"]

ADVANTAGES: dict[str, AdvantageKind] = {}
"""Advantage kind name -> ``f(dev, std, std_eps)`` ``[N]``, in registration order."""


def register_advantage(name: str) -> Callable[[AdvantageKind], AdvantageKind]:
    """Function decorator: register an advantage kind under ``name`` (``grpo.advantage=<name>``)."""

    def register(fn: AdvantageKind) -> AdvantageKind:
        if name in ADVANTAGES:
            raise ValueError(f"advantage kind {name!r} is registered twice")
        ADVANTAGES[name] = fn
        return fn

    return register


@register_advantage("grpo")
def grpo(dev: Tensor, std: Tensor, std_eps: float) -> Tensor:
    """``A_i = (r_i - mean_g) / (std_g + std_eps)`` (DeepSeekMath, arXiv:2402.03300); 0 where the
    denominator is 0 (``std_eps = 0`` and a flat group)."""
    denom = std + std_eps
    return (dev / denom.clamp(min=1e-30)).where(denom > 0, 0.0)


@register_advantage("dr_grpo")
def dr_grpo(dev: Tensor, std: Tensor, std_eps: float) -> Tensor:
    """``A_i = r_i - mean_g`` (Dr.GRPO, arXiv:2503.20783): rewards keep their own units."""
    return dev
