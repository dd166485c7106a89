"""The ``research`` domain as the core finds it: ``[project.entry-points."wmrl.domains"]`` names this
module.

It registers :class:`ResearchPlugin` as ``--domain.type=research``: the config's fields and checks
(:class:`wmrl_research.config.ResearchConfig`) and the hooks the core calls on a domain config,
``build`` (policy + SFT -> execution log -> outcome WM -> the
:class:`wmrl_research.domain.ResearchDomain`, wmrl_research.pipeline), ``sft_data_parallel`` and
``export`` (wmrl_research.export). Light to import: each hook loads torch, transformers and the
sandbox when it is called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wmrl.config import DomainConfig
from wmrl_research.config import ResearchConfig

if TYPE_CHECKING:
    from pathlib import Path

    from wmrl.config import RunConfig
    from wmrl_research.domain import ResearchDomain


@DomainConfig.register_subclass("research")
@dataclass
class ResearchPlugin(ResearchConfig):
    """:class:`ResearchConfig` with the build, SFT and export hooks of the ``research`` domain."""

    # The default non-inferiority margin on the held-out score (score_mean), and the domain's name
    # for people (wmrl.domain.DomainConfigCapabilities).
    NONINFERIORITY_MARGIN = 0.02
    DISPLAY_NAME = "AutoResearch agent"
    # The SFT policy every method starts from is trained with the run seed (its cache key holds it):
    # each seed of a grid starts from its own policy.
    START_PER_SEED = True

    def build(self, run: RunConfig) -> ResearchDomain:
        from wmrl_research.pipeline import build_domain

        return build_domain(self, run)

    def sft_data_parallel(self, run: RunConfig, accelerator: Any) -> None:
        """The SFT stage on every process of a data-parallel run, before :meth:`build` (which then
        reads the cached SFT policy)."""
        from wmrl_research.pipeline import sft_data_parallel

        sft_data_parallel(self, run, accelerator)

    def export(self, run: RunConfig, state: dict, out: Path, adapter: bool = False) -> dict[str, Any]:
        """``wmrl export``: the agent (transformers folder or LoRA adapter) and the outcome WM of a
        run's checkpoint (wmrl_research.export)."""
        from wmrl_research.export import export_research

        return export_research(self, run, state, out, adapter)
