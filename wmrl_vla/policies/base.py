"""The base of the VLA policy kinds and their registry (:mod:`wmrl_vla.policies` imports the kinds).

A kind reads the domain config through :class:`PolicyConfig`, the fields it uses, so that the
config (which checks ``domain.policy`` against the registry) and the kinds do not import each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from wmrl_vla.demos import DemoConfig, cache_key, demo_fields

if TYPE_CHECKING:
    import torch

    from wmrl_vla.chain_config import DenoisingChainConfig
    from wmrl_vla.lerobot_env import LeRobotEnvConfig

# Bump when the policy's architecture changes, so stale SFT caches are not loaded.
POLICY_ARCH = 4


class PolicyConfig(DemoConfig, Protocol):
    """The domain config fields a policy kind reads (:class:`wmrl_vla.config.VLAConfig` has them)."""

    cache_dir: str
    policy: str
    policy_path: str | None
    env: LeRobotEnvConfig
    chain: DenoisingChainConfig
    n_bins: int
    d_model: int
    n_layers: int
    locator: bool
    sft_epochs: int
    sft_batch_size: int
    sft_lr: float
    sft_shift: int
    sft_aux_goal: float
    dagger_rounds: int
    dagger_episodes_per_task: int
    dagger_epochs: int


POLICY_KINDS: dict[str, type[PolicyKind]] = {}


def register_policy_kind(cls: type[PolicyKind]) -> type[PolicyKind]:
    """Class decorator: ``cls`` becomes the choice ``--domain.policy=<cls.name>``."""
    if cls.name in POLICY_KINDS:
        raise ValueError(f"VLA policy kind {cls.name!r} is registered twice")
    POLICY_KINDS[cls.name] = cls
    return cls


class PolicyKind:
    """One kind of VLA policy for a domain config ``cfg``. Subclasses set the class flags and
    override :meth:`build`, :meth:`prepare` and :meth:`export`."""

    name: ClassVar[str]
    # a lerobot network: run in float32 only (``--precision=bf16`` is refused), exported tagged lerobot
    lerobot: ClassVar[bool] = True
    # its visual features can be predicted from the WM latent (``domain.imagine_input=latent``)
    reads_latent: ClassVar[bool] = False
    # behaviour cloning runs on every process of a data-parallel run (else in the main one, at build)
    sft_data_parallel: ClassVar[bool] = False
    # the lerobot folder ``type`` this kind post-trains itself (``domain.policy_path``); None: the
    # pretrained kind loads such folders
    folder_type: ClassVar[str | None] = None
    # why ``wmrl export`` cannot write this kind yet (None: it can)
    export_refused: ClassVar[str | None] = None
    # the policy acts by a denoising chain it records with each rollout (``records_chain``): it draws
    # (K+1) x H x A normals a step, so it cannot share common random numbers (``ppi``'s twin anchors)
    records_chain: ClassVar[bool] = False

    def __init__(self, cfg: PolicyConfig) -> None:
        self.cfg = cfg

    @classmethod
    def check_folder(cls, config, path) -> None:
        """A lerobot folder of :attr:`folder_type` (its lerobot ``config``) this kind cannot post-train
        raises :class:`wmrl_vla.lerobot_policy.PolicyPathError` (one line); others pass."""

    def cache_fields(self) -> dict[str, Any]:
        """The config fields the SFT stage's cache key hashes (those of the demos included)."""
        cfg = self.cfg
        return {**demo_fields(cfg), "policy": cfg.policy, "n_bins": cfg.n_bins, "d_model": cfg.d_model,
                "n_layers": cfg.n_layers, "sft_epochs": cfg.sft_epochs, "sft_batch_size": cfg.sft_batch_size,
                "sft_lr": cfg.sft_lr, "arch": POLICY_ARCH}  # fmt: skip

    def cache_path(self) -> Path:
        """The SFT stage's cached checkpoint (its ``.json`` beside it: the SFT's figures and fields)."""
        return Path(self.cfg.cache_dir) / f"sft-{cache_key(self.cache_fields())}.pt"

    def build(self):
        """The policy's network, untrained (``wmrl export`` fills it from a checkpoint)."""
        raise NotImplementedError

    def prepare(self, demos: list[dict], device: torch.device, accelerator=None, progress: bool = True):
        """The policy to post-train, on ``device``: loaded from :meth:`cache_path`, or cloned from
        ``demos`` and cached there."""
        raise NotImplementedError

    def export(self, policy, out: Path) -> tuple[dict[str, Any], list[str]]:
        """Write the post-trained ``policy`` to the folder ``out``: (its ``export.json`` entry: format,
        library, class, files, how to load it; notes for the folder's README)."""
        raise NotImplementedError

    @property
    def export_type(self) -> str:
        """The policy's ``type`` in ``export.json``."""
        return self.name

    def words(self) -> str:
        """What a run's messages call its starting policy."""
        return "the SFT policy"
