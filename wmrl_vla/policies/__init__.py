"""The VLA policy kinds, registered by name (``--domain.policy=<name>``), as lerobot registers its policies.

A kind owns everything that differs between policies: the fields of its SFT cache key, its network
built from the domain config (one place, shared by the pipeline and ``wmrl export``), its SFT (or
none), its export folder, and the flags the rest of the domain asks about (a lerobot network runs in
float32 only; only the small VLA's visual features can be read from the WM's latent). Each kind lives
in a module of this package, imported here so that it registers; each module is light to import
(torch, lerobot and MuJoCo load when a method runs).

``domain.policy_path`` (the user's lerobot policy folder) sets ``domain.policy`` to the folder's kind
(the config does, from the folder's ``type``): a kind that loads such folders itself (its
``folder_type``, e.g. ``lerobot_diffusion``) is that kind; any other folder is
:class:`LeRobotPretrained`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from wmrl_vla.config import VLAConfig

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

    def __init__(self, cfg: VLAConfig) -> None:
        self.cfg = cfg

    @classmethod
    def check_folder(cls, config, path) -> None:
        """A lerobot folder of :attr:`folder_type` (its lerobot ``config``) this kind cannot post-train
        raises :class:`wmrl_vla.lerobot_policy.PolicyPathError` (one line); others pass."""

    def cache_fields(self) -> dict[str, Any]:
        """The config fields the SFT stage's cache key hashes (those of the demos included)."""
        from wmrl_vla.pipeline import POLICY_ARCH, _demo_fields

        cfg = self.cfg
        return {**_demo_fields(cfg), "policy": cfg.policy, "n_bins": cfg.n_bins, "d_model": cfg.d_model,
                "n_layers": cfg.n_layers, "sft_epochs": cfg.sft_epochs, "sft_batch_size": cfg.sft_batch_size,
                "sft_lr": cfg.sft_lr, "arch": POLICY_ARCH}  # fmt: skip

    def cache_path(self) -> Path:
        """The SFT stage's cached checkpoint (its ``.json`` beside it: the SFT's figures and fields)."""
        from wmrl_vla.pipeline import _key

        return Path(self.cfg.cache_dir) / f"sft-{_key(self.cache_fields())}.pt"

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


def policy_kind(cfg: VLAConfig) -> PolicyKind:
    """The registered kind of ``cfg``'s policy (``domain.policy_path`` first)."""
    if cfg.policy_path is not None:
        kind = POLICY_KINDS.get(cfg.policy)
        return kind(cfg) if kind is not None and kind.folder_type is not None else LeRobotPretrained(cfg)
    if cfg.policy not in POLICY_KINDS:
        raise ValueError(f"domain.policy={cfg.policy!r} is not one of {', '.join(POLICY_KINDS)}")
    return POLICY_KINDS[cfg.policy](cfg)


def folder_kind(folder_type: str) -> type[PolicyKind] | None:
    """The registered kind that post-trains lerobot folders of ``folder_type`` itself, if any."""
    return next((k for k in POLICY_KINDS.values() if k.folder_type == folder_type), None)


# the kinds register on import (below the registry they use)
from wmrl_vla.policies import small_vla as _small_vla  # noqa: E402, F401, I001
from wmrl_vla.policies import lerobot_bridges as _lerobot_bridges  # noqa: E402, F401
from wmrl_vla.policies import lerobot_diffusion as _lerobot_diffusion  # noqa: E402, F401
from wmrl_vla.policies.lerobot_pretrained import LeRobotPretrained  # noqa: E402
