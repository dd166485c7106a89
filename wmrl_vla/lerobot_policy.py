"""A policy a user trained with lerobot (a ``pretrained_model`` folder or hub id) as WMRL's policy.

``lerobot-train`` saves a policy folder: ``config.json`` + ``model.safetensors`` (the network) and
``policy_preprocessor.json`` / ``policy_postprocessor.json`` (+ their ``*.safetensors`` state: the
dataset's normalisation statistics). :class:`PretrainedLeRobotPolicy` loads all of it with lerobot's
own loaders (``PreTrainedConfig.from_pretrained``, the policy class's ``from_pretrained``,
``make_pre_post_processors(..., pretrained_path=...)``), so the network sees exactly the inputs it saw
in training, and wraps a deterministic action in a Gaussian (as :mod:`wmrl_vla.lerobot_bridge`)::

    o  = preprocessor({"observation.image": img / 255, "observation.state": s, "task": l})  # normalised
    mu = postprocessor(chunk(o)[:, 0])        # the first action of the chunk, unnormalised [B, A]
    a ~ N(mu, diag(exp(log_std))^2)           # env units; log_std learnable, per action dim

where ``chunk`` is the policy's own action chunk ``[B, chunk_size, A]``:

- ``act``: ACT's deterministic chunk (its decoder output; no VAE sampling in eval mode);
- ``smolvla``: SmolVLA's flow-matching sample integrated from the fixed noise 0 (the noise
  distribution's mode), ``SmolVLAPolicy._get_action_chunk(batch, noise=0)``: the same Euler steps
  ``select_action`` runs, made deterministic and differentiable (as :mod:`wmrl_vla.smolvla_bridge`
  does). Its language tokens come from the folder's own tokenizer step (``policy.tokenizer.encode``
  runs it, padded to ``tokenizer_max_length``), so GRPO re-reads a rollout's instruction ids.
  ``lerobot-eval`` samples SmolVLA's noise at random: the exported policy acts as WMRL's mean only
  with ``noise=0`` (its success matches WMRL's in distribution, not episode by episode).

Action chunks: ACT predicts ``chunk_size`` actions per observation and lerobot executes
``n_action_steps`` of them open-loop. The clipped-ratio loss needs the log-prob of what was executed
given what was observed, so WMRL queries the policy at every step and executes the chunk's first
action (``n_action_steps=1``; temporal ensembling off); the exported folder says so in its
``config.json``, which makes ``lerobot-eval`` run the post-trained policy exactly as WMRL did.

Supported: ``act`` and ``smolvla`` here, and ``diffusion`` through the log-probability of its
denoising chain (:mod:`wmrl_vla.diffusion_bridge`, :func:`load_lerobot_folder`; ``n_obs_steps=1``).
pi0, pi05 and the other lerobot policies fail with one line naming what is missing
(:func:`check_supported`; pi0's PaliGemma backbone is not available offline here).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from wmrl_vla.lerobot_bridge import GaussianActionHead
from wmrl_vla.policy import InstructionTokenizer

SUPPORTED_TYPES = ("act", "smolvla", "diffusion")
# Why the others are refused (check_supported).
REFUSED = {
    "pi0": "pi0's PaliGemma backbone is not available offline and its flow-matching chain is not wired in",
    "pi05": "pi05's PaliGemma backbone is not available offline and its flow-matching chain is not wired in",
}
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
    """One line naming what is missing for a policy type GRPO cannot post-train yet."""
    if kind not in SUPPORTED_TYPES:
        why = REFUSED.get(kind, f"{kind}'s sampler is not wired in")
        raise PolicyPathError(
            f"domain.policy_path={path} holds a {kind!r} policy, which has no log-probability for GRPO "
            f"yet ({why}); supported: {', '.join(SUPPORTED_TYPES)}"
        )


def load_lerobot_folder(path: str | Path):
    """(policy on the CPU, preprocessor, postprocessor) of a lerobot policy folder, loaded with
    lerobot's own loaders; the policy executes its chunk's first action (``n_action_steps=1``,
    temporal ensembling off: module docstring)."""
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    kind = policy_config(path).type
    check_supported(kind, path)
    policy = get_policy_class(kind).from_pretrained(str(path))
    c = policy.config
    c.device = "cpu"
    if getattr(c, "temporal_ensemble_coeff", None) is not None:
        c.temporal_ensemble_coeff = None
    c.n_action_steps = 1
    pre, post = make_pre_post_processors(
        c, pretrained_path=str(path), preprocessor_overrides={"device_processor": {"device": "cpu"}}
    )
    return policy.to("cpu"), pre, post


class ProcessorTokenizer:
    """A policy folder's own language steps (``NewLineTaskProcessorStep`` + ``TokenizerProcessorStep``)
    behind the domain's ``tokenizer.encode(texts) -> [B, L]`` interface, padded to the step's
    ``max_length`` so every rollout's ids have one width (right padding: the attention mask is
    ``ids != pad_id``, which :meth:`encode` checks)."""

    def __init__(self, preprocessor) -> None:
        from lerobot.processor import TokenizerProcessorStep

        steps = [s for s in preprocessor.steps if isinstance(s, TokenizerProcessorStep)]
        if len(steps) != 1 or steps[0].padding_side != "right":
            raise PolicyPathError("the policy's preprocessor has no right-padding tokenizer step")
        self.step = steps[0]
        self.pad_id = int(self.step.input_tokenizer.pad_token_id)

    @staticmethod
    def without_language(preprocessor):
        """The preprocessor without its language steps (the ids come from :meth:`encode`)."""
        from dataclasses import replace

        from lerobot.processor import NewLineTaskProcessorStep, TokenizerProcessorStep

        language = (NewLineTaskProcessorStep, TokenizerProcessorStep)
        return replace(preprocessor, steps=[s for s in preprocessor.steps if not isinstance(s, language)])

    def encode(self, texts) -> torch.Tensor:
        """``[B, max_length]`` ids of ``texts``, each ending in a newline as lerobot's step appends."""
        if isinstance(texts, str):
            raise TypeError("encode() takes a sequence of instructions, not one string")
        step = self.step
        out = step.input_tokenizer(
            [t if t.endswith("\n") else f"{t}\n" for t in texts],
            max_length=step.max_length,
            truncation=step.truncation,
            padding="max_length",
            padding_side="right",
            return_tensors="pt",
        )
        ids = out["input_ids"].long()
        if not torch.equal(out["attention_mask"].bool(), self.attention_mask(ids)):
            raise ValueError("an instruction tokenises to the pad token; its attention mask is ambiguous")
        return ids

    def attention_mask(self, ids: torch.Tensor) -> torch.Tensor:
        return ids != self.pad_id


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

        from lerobot.policies.factory import get_policy_class

        kind = policy_config(path).type
        if kind == "diffusion":
            raise PolicyPathError(
                f"domain.policy_path={path} holds a diffusion policy: load it with DiffusionChainPolicy"
            )
        check_supported(kind, path)
        self.path = str(path)
        self.policy_cls = get_policy_class(kind)
        lerobot_policy, self.preprocessor, self.postprocessor = load_lerobot_folder(path)
        c = lerobot_policy.config
        self.lerobot_policy = lerobot_policy
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
        self.uses_instr = kind == "smolvla"
        if self.uses_instr:
            self.tokenizer = ProcessorTokenizer(self.preprocessor)
            self.observation_preprocessor = self.tokenizer.without_language(self.preprocessor)
        else:
            self.tokenizer = InstructionTokenizer()  # the domain tokenises instructions; ACT ignores them
            self.observation_preprocessor = self.preprocessor
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
        """``[B, A]``: the first action of the policy's chunk, in env units (differentiable). ``instr``
        ``[B, L]``: ids from ``self.tokenizer.encode`` (SmolVLA; ACT ignores them)."""
        from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS

        batch = self.observation_preprocessor(self.observation(images, states))
        pol = self.lerobot_policy
        if self.uses_instr:
            if instr is None:
                raise ValueError("SmolVLA needs the instruction ids (policy.tokenizer.encode)")
            batch[OBS_LANGUAGE_TOKENS] = instr
            batch[OBS_LANGUAGE_ATTENTION_MASK] = self.tokenizer.attention_mask(instr)
            c = pol.config
            noise = torch.zeros(images.shape[0], c.chunk_size, c.max_action_dim, device=images.device)
            chunk = pol._get_action_chunk(pol._prepare_batch(batch), noise=noise)  # [B, chunk, A]
        else:
            batch["observation.images"] = [batch[k] for k in self.image_keys]
            chunk = pol.model(batch)[0]  # [B, chunk_size, A], normalised
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


def train_lerobot_policy(
    policy, dataset_root: str | Path, repo_id: str, out_dir: str | Path, steps: int,
    batch_size: int = 8, seed: int = 0,
) -> Path:  # fmt: skip
    """Train the lerobot policy config ``policy`` with lerobot's own training loop
    (``lerobot.scripts.lerobot_train.train``) on a local LeRobotDataset, as ``lerobot-train`` would;
    returns its last ``pretrained_model`` folder."""
    from lerobot.configs.default import DatasetConfig, WandBConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.scripts.lerobot_train import train

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


def train_act(
    dataset_root: str | Path,
    repo_id: str,
    out_dir: str | Path,
    steps: int,
    batch_size: int = 8,
    seed: int = 0,
    **act_fields,
) -> Path:
    """An ACT trained by :func:`train_lerobot_policy`; lerobot takes its inputs from the dataset's
    ``observation.*`` columns, as ``lerobot-train --policy.type=act`` does. ``act_fields`` override
    ACT's config (``dim_model``, ``chunk_size``, ...). No hub: ``pretrained_backbone_weights=None``."""
    from lerobot.policies.act.configuration_act import ACTConfig

    policy = ACTConfig(
        pretrained_backbone_weights=None,
        device="cpu",
        push_to_hub=False,
        **act_fields,
    )
    return train_lerobot_policy(policy, dataset_root, repo_id, out_dir, steps, batch_size, seed)


def folder_stamp(path: str | Path) -> str | None:
    """Size and modification time of every file under a local folder (None for a hub id): part of
    the cache keys of what is built from it, so retraining into the same folder rebuilds them."""
    p = Path(path)
    if not p.is_dir():
        return None
    files = sorted(f for f in p.rglob("*") if f.is_file())
    return ";".join(f"{f.relative_to(p)}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
