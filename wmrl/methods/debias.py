"""``debias``: the world model's scores through the online isotonic calibration (wmrl/debias.py)."""

from wmrl.methods.base import Method, register_method


@register_method
class Debias(Method):
    """Mix with calibrated WM scores: the map is refitted on the step's anchors before it is applied."""

    name = "debias"
    summary = (
        "anchor groups executed for real, the other groups scored by the world model calibrated online on "
        "the anchors"
    )
    calibrates = True
    config_sections = ("anchors",)
