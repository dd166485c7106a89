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

from typing import TYPE_CHECKING

from wmrl_vla.policies.base import POLICY_KINDS, PolicyKind, register_policy_kind

# isort: off
# the kinds register on import, in the order ``domain.policy`` lists them
from wmrl_vla.policies import small_vla as _small_vla  # noqa: F401
from wmrl_vla.policies import lerobot_bridges as _lerobot_bridges  # noqa: F401
from wmrl_vla.policies import lerobot_diffusion as _lerobot_diffusion  # noqa: F401
from wmrl_vla.policies import lerobot_smolvla_chain as _lerobot_smolvla_chain  # noqa: F401
from wmrl_vla.policies.lerobot_pretrained import LeRobotPretrained
# isort: on

if TYPE_CHECKING:
    from wmrl_vla.policies.base import PolicyConfig

__all__ = [
    "POLICY_KINDS",
    "PolicyKind",
    "check_policy_path",
    "folder_kind",
    "policy_kind",
    "register_policy_kind",
]


def policy_kind(cfg: PolicyConfig) -> PolicyKind:
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


def check_policy_path(path: str, image_size: int) -> str:
    """A policy folder WMRL can post-train at ``image_size``: a supported type whose inputs are one
    camera image of that square size and one state; returns its type (``act``, ``smolvla``,
    ``diffusion``). Raises
    :class:`wmrl_vla.lerobot_policy.PolicyPathError` (one line)."""
    from wmrl_vla.lerobot_policy import PolicyPathError, check_supported, policy_config

    cfg = policy_config(path)
    check_supported(cfg.type, path)
    kind = folder_kind(cfg.type)
    if kind is not None:  # the kind that post-trains such folders itself refuses what it cannot
        kind.check_folder(cfg, path)
    images = {k: tuple(f.shape) for k, f in cfg.image_features.items()}
    if len(images) != 1 or cfg.robot_state_feature is None:
        raise PolicyPathError(
            f"domain.policy_path={path}: WMRL feeds one camera image and one state; the policy's "
            f"inputs are {sorted(cfg.input_features)}"
        )
    (shape,) = images.values()
    if shape != (3, image_size, image_size):
        raise PolicyPathError(
            f"domain.policy_path={path} was trained on images of shape {list(shape)}; set "
            f"domain.image_size={shape[-1]} so the env renders what it saw"
        )
    return cfg.type
