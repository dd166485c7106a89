"""``wmrl``: calibration and denoising together (docs/design.md section 1)."""

from wmrl.methods.base import Method, register_method


@register_method
class WMRL(Method):
    """Calibrated WM scores and anchor advantages times ``w``, the residual measured after calibration."""

    name = "wmrl"
    summary = (
        "anchor groups executed for real (advantages weighted by w), the other groups scored by the world "
        "model calibrated online on the anchors"
    )
    calibrates = True
    denoises = True
    config_sections = ("anchors",)
