"""``real``: standard GRPO, every rollout group executed for real."""

from wmrl.methods.base import Method, register_method


@register_method
class Real(Method):
    name = "real"
    summary = "standard GRPO: every rollout group executed for real"
    executes = "all"
    uses_wm = False
    role = "reference"
