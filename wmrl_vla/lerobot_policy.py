"""A policy a user trained with lerobot (a ``pretrained_model`` folder or hub id) as WMRL's policy.

``lerobot-train`` saves a policy folder: ``config.json`` + ``model.safetensors`` (the network) and
``policy_preprocessor.json`` / ``policy_postprocessor.json`` (+ their ``*.safetensors`` state: the
dataset's normalisation statistics). :class:`PretrainedLeRobotPolicy` loads all of it with lerobot's
own loaders (``PreTrainedConfig.from_pretrained``, the policy class's ``from_pretrained``,
``make_pre_post_processors(..., pretrained_path=...)``), so the network sees exactly the inputs it saw
in training, and wraps the deterministic action in a Gaussian (as :mod:`wmrl_vla.lerobot_bridge`)::

    o  = preprocessor({"observation.image": img / 255, "observation.state": s})   # normalised
    mu = postprocessor(ACT(o)[:, 0])          # the first action of the chunk, unnormalised [B, A]
    a ~ N(mu, diag(exp(log_std))^2)           # env units; log_std learnable, per action dim

Action chunks: ACT predicts ``chunk_size`` actions per observation and lerobot executes
``n_action_steps`` of them open-loop. The clipped-ratio loss needs the log-prob of what was executed
given what was observed, so WMRL queries the policy at every step and executes the chunk's first
action (``n_action_steps=1``; temporal ensembling off); the exported folder says so in its
``config.json``, which makes ``lerobot-eval`` run the post-trained policy exactly as WMRL did.

Supported: ``act``. SmolVLA, pi0, diffusion and the other lerobot policies sample their action
(flow matching or denoising from noise), so they have no deterministic mean to put a Gaussian around
without a choice of their own; they fail with one line naming what is missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from wmrl_vla.lerobot_bridge import GaussianActionHead
from wmrl_vla.policy import InstructionTokenizer

SUPPORTED_TYPES = ("act",)
HEAD_FILE = "gaussian_head.safetensors"


class PolicyPathError(ValueError):
    """A policy folder that cannot be post-trained (missing files, unsupported type)."""


def policy_config(path: str | Path):
    """The ``PreTrainedConfig`` of a lerobot policy folder's ``config.json`` (or a hub id's)."""
    import lerobot.policies  # noqa: F401  (registers every policy type's config)
    from lerobot.configs.policies import PreTrainedConfig

    p = Path(path)
    if p.exists() and not (p / "config.json").is_file():
        raise PolicyPathError(
            f"domain.policy_path={path} has no config.json; point it at the `pretrained_model` folder "
            "lerobot-train saved (checkpoints/<step>/pretrained_model)"
        )
    if not p.exists() and str(path).count("/") != 1:
        raise PolicyPathError(f"domain.policy_path={path} is neither a folder nor a hub id (user/name)")
    try:
        return PreTrainedConfig.from_pretrained(str(path))
    except (OSError, ValueError) as e:  # offline, unknown repo, unreadable config
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PolicyPathError(f"domain.policy_path={path} could not be read: {first}") from None


def check_supported(kind: str, path: str | Path) -> None:
    if kind not in SUPPORTED_TYPES:
        raise PolicyPathError(
            f"domain.policy_path={path} holds a {kind!r} policy; WMRL post-trains "
            f"{', '.join(SUPPORTED_TYPES)} (a deterministic action to centre its Gaussian on): {kind} "
            "samples its action from noise and needs a log-prob of its own sampler, not implemented yet"
        )


class PretrainedLeRobotPolicy(GaussianActionHead):
    """A lerobot policy folder behind WMRL's policy interface. See the module docstring.

    Images in are ``[B, 3, H, W]`` uint8 (the env's camera, as lerobot's ``preprocess_observation``
    takes them) and states ``[B, S]`` (the env's ``agent_pos``)."""

    def __init__(
        self,
        path: str | Path,
        init_log_std: float = -1.0,
        min_log_std: float = -4.0,
        max_log_std: float = 1.0,
    ) -> None:
        super().__init__()
        from types import SimpleNamespace

        from lerobot.policies.factory import get_policy_class, make_pre_post_processors

        kind = policy_config(path).type
        check_supported(kind, path)
        self.path = str(path)
        self.policy_cls = get_policy_class(kind)
        lerobot_policy = self.policy_cls.from_pretrained(self.path)
        c = lerobot_policy.config
        c.device = "cpu"
        if getattr(c, "temporal_ensemble_coeff", None) is not None:
            c.temporal_ensemble_coeff = None  # WMRL executes the chunk's first action (module docstring)
        c.n_action_steps = 1
        self.lerobot_policy = lerobot_policy.to("cpu")
        self.preprocessor, self.postprocessor = make_pre_post_processors(
            c, pretrained_path=self.path, preprocessor_overrides={"device_processor": {"device": "cpu"}}
        )
        self.image_keys = list(c.image_features)
        state = c.robot_state_feature
        if state is None or len(self.image_keys) != 1:
            raise PolicyPathError(
                f"domain.policy_path={path}: WMRL feeds one camera image and one state; the policy's "
                f"inputs are {sorted(c.input_features)}"
            )
        self.state_key = "observation.state"
        action_dim = c.action_feature.shape[0]
        self.cfg = SimpleNamespace(
            action_dim=action_dim, min_log_std=min_log_std, max_log_std=max_log_std, init_log_std=init_log_std
        )
        self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))
        self.tokenizer = InstructionTokenizer()  # the domain tokenises instructions; ACT ignores them
        self.train()

    @property
    def image_shape(self) -> tuple[int, ...]:
        return tuple(self.lerobot_policy.config.image_features[self.image_keys[0]].shape)

    def train(self, mode: bool = True) -> PretrainedLeRobotPolicy:
        """The lerobot network stays in eval mode (no dropout, no VAE sampling, BatchNorm on running
        statistics): a rollout's log-prob must be a deterministic function of its observation."""
        super().train(mode)
        self.lerobot_policy.eval()
        return self

    def observation(self, images: torch.Tensor, states: torch.Tensor) -> dict[str, torch.Tensor]:
        """lerobot's observation batch before its preprocessor, as ``lerobot-eval`` builds it from
        the env (``preprocess_observation``): float images in [0, 1] and float32 states."""
        if images.dim() != 4 or tuple(images.shape[1:]) != self.image_shape:
            raise ValueError(
                f"images have shape {tuple(images.shape)}, the policy was trained on {self.image_shape}"
            )
        return {self.image_keys[0]: images.float() / 255.0, self.state_key: states.float()}

    def step_mean(
        self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[B, A]``: the first action of the policy's chunk, in env units (differentiable)."""
        batch = self.preprocessor(self.observation(images, states))
        batch["observation.images"] = [batch[k] for k in self.image_keys]
        chunk = self.lerobot_policy.model(batch)[0]  # [B, chunk_size, A], normalised
        return self.postprocessor(chunk[:, 0])

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, path) -> None:
        torch.save({"policy_path": self.path, "state_dict": self.state_dict()}, path)

    @classmethod
    def load(cls, path) -> PretrainedLeRobotPolicy:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        model = cls(ckpt["policy_path"])
        model.load_state_dict(ckpt["state_dict"])
        return model

    def save_pretrained(self, out: str | Path) -> list[str]:
        """Write a lerobot policy folder (the post-trained network, ``n_action_steps=1``, and the same
        processors) that ``lerobot-eval --policy.path=OUT`` loads, plus the Gaussian's ``log_std``
        (``gaussian_head.safetensors``; lerobot ignores it). Returns the files written."""
        from safetensors.torch import save_file

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.lerobot_policy.save_pretrained(out)
        self.preprocessor.save_pretrained(out)
        self.postprocessor.save_pretrained(out)
        save_file({"log_std": self.log_std.detach().clone().contiguous()}, str(out / HEAD_FILE))
        (out / "wmrl_bridge.json").write_text(
            json.dumps({"type": type(self).__name__, "source_policy_path": self.path}, indent=2)
        )
        return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


def check_policy_path(path: str | Path, image_size: int) -> None:
    """A policy folder WMRL can post-train at ``image_size``: a supported type whose inputs are one
    camera image of that square size and one state. Raises :class:`PolicyPathError` (one line)."""
    cfg = policy_config(path)
    check_supported(cfg.type, path)
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


def train_act(
    dataset_root: str | Path,
    repo_id: str,
    out_dir: str | Path,
    steps: int,
    batch_size: int = 8,
    seed: int = 0,
    **act_fields,
) -> Path:
    """Train an ACT with lerobot's own training loop (``lerobot.scripts.lerobot_train.train``) on a
    local LeRobotDataset, as ``lerobot-train`` would; returns its last ``pretrained_model`` folder.

    The inputs are the dataset's ``observation.image`` and ``observation.state`` (a WMRL recording
    also holds ``observation.final``, a bookkeeping flag that is no input); ``act_fields`` override
    ACT's config (``dim_model``, ``chunk_size``, ...). No hub: ``pretrained_backbone_weights=None``."""
    from lerobot.configs.default import DatasetConfig, WandBConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.datasets import LeRobotDatasetMetadata
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.scripts.lerobot_train import train

    meta = LeRobotDatasetMetadata(repo_id, root=dataset_root)
    img, state = meta.features["observation.image"]["shape"], meta.features["observation.state"]["shape"]
    c, h, w = (img[2], img[0], img[1]) if img[-1] == 3 else tuple(img)
    policy = ACTConfig(
        input_features={
            "observation.image": PolicyFeature(type=FeatureType.VISUAL, shape=(c, h, w)),
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=tuple(state)),
        },
        pretrained_backbone_weights=None,
        device="cpu",
        push_to_hub=False,
        **act_fields,
    )
    cfg = TrainPipelineConfig(
        dataset=DatasetConfig(repo_id=repo_id, root=str(dataset_root)),
        policy=policy,
        output_dir=Path(out_dir),
        steps=steps,
        batch_size=batch_size,
        num_workers=0,
        save_freq=steps,
        log_freq=max(1, steps // 4),
        seed=seed,
        wandb=WandBConfig(enable=False),
    )
    train(cfg)
    return Path(out_dir) / "checkpoints" / "last" / "pretrained_model"


def folder_stamp(path: str | Path) -> str | None:
    """Size and modification time of every file under a local folder (None for a hub id): part of
    the cache keys of what is built from it, so retraining into the same folder rebuilds them."""
    p = Path(path)
    if not p.is_dir():
        return None
    files = sorted(f for f in p.rglob("*") if f.is_file())
    return ";".join(f"{f.relative_to(p)}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
