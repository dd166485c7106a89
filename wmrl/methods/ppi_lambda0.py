"""``ppi_lambda0``: ppi's own code path with the world model's share switched off, a control
(docs/design.md section 7): with ``λ = 0`` ppi's update is GRPO on the anchors alone, so ppi gains
from its WM only where it beats this."""

from wmrl.methods.base import Control


class PPILambda0(Control):
    """``ppi`` under ``--ppi.lam=0``; the override alone makes the difference, so a run of it is a
    ppi run whose config says ``ppi.lam: 0``."""

    suffix = "lambda0"
    label = "λ=0"
    note = "`ppi_lambda0`: ppi with λ = 0"
    overrides = ("--ppi.lam=0",)
