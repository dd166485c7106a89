"""``wm``: every rollout scored by the world model, none executed."""

from wmrl.methods.base import Method, register_method


@register_method
class WorldModelOnly(Method):
    """GRPO on the WM's raw scores alone: no anchor, so no calibration, no denoising and no WM
    refinement (the WM learns from graded anchors only)."""

    name = "wm"
    summary = "every rollout scored by the world model, none executed"
    executes = "none"
