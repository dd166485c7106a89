"""``denoise``: anchor advantages weighted by the inverse-variance weight ``w`` (wmrl/denoise.py)."""

from wmrl.methods.base import Method, register_method


@register_method
class Denoise(Method):
    """Mix with anchor advantages times ``w``, the WM's residual measured on its raw scores."""

    name = "denoise"
    summary = (
        "anchor groups executed for real with their advantages weighted by the denoiser's w, the other "
        "groups scored by the world model"
    )
    denoises = True
    config_sections = ("anchors",)
