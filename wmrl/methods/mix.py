"""``mix``: anchors' true rewards and the world model's raw scores, uncorrected."""

from wmrl.methods.base import Method, register_method


@register_method
class Mix(Method):
    name = "mix"
    summary = "anchor groups executed for real, the other groups scored by the world model's raw scores"
    config_sections = ("anchors",)
