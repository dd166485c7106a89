"""The ``vla`` domain as the core finds it: ``[project.entry-points."wmrl.domains"]`` names this module.

It registers :class:`VLAPlugin` as ``--domain.type=vla``: the config's fields and checks
(:class:`wmrl_vla.config.VLAConfig`) and the hooks the core calls on a domain config, ``build``
(demos -> SFT -> WM pretraining -> the :class:`wmrl_vla.domain.VLADomain`, wmrl_vla.pipeline),
``sft_data_parallel`` and ``export`` (wmrl_vla.export). Light to import: each hook loads torch,
MuJoCo and lerobot when it is called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wmrl.config import DomainConfig
from wmrl_vla.config import VLAConfig

if TYPE_CHECKING:
    from pathlib import Path

    from wmrl.config import RunConfig
    from wmrl_vla.domain import VLADomain


@DomainConfig.register_subclass("vla")
@dataclass
class VLAPlugin(VLAConfig):
    """:class:`VLAConfig` with the build, SFT and export hooks of the ``vla`` domain."""

    # The default non-inferiority margin on the held-out success rate (0.01: one point), and the
    # domain's name for people (wmrl.domain.DomainConfigCapabilities).
    NONINFERIORITY_MARGIN = 0.01
    DISPLAY_NAME = "VLA"

    def build(self, run: RunConfig) -> VLADomain:
        from wmrl_vla.pipeline import build_domain

        return build_domain(self, run)

    def sft_data_parallel(self, run: RunConfig, accelerator: Any) -> None:
        """The SFT stage on every process of a data-parallel run, before :meth:`build` (which then
        reads the cached SFT policy)."""
        from wmrl_vla.pipeline import sft_data_parallel

        sft_data_parallel(self, run, accelerator)

    def export(self, run: RunConfig, state: dict, out: Path, adapter: bool = False) -> dict[str, Any]:
        """``wmrl export``: the policy and the world model of a run's checkpoint (wmrl_vla.export)."""
        from wmrl_vla.export import export_vla

        return export_vla(self, run, state, out, adapter)
