"""Post-train a lerobot policy with GRPO: its continuous action becomes the mean of a Gaussian.

lerobot's ACT regresses actions (L1), so it has no log-probs. The bridge keeps ACT (built from its
config, ``pretrained_backbone_weights=None``: random or local weights, no hub) as the mean network
and adds a learnable, state-independent log standard deviation per action dimension:

    a ~ N(mu_ACT(o), diag(exp(log_std))^2)

To fit the core's token-level loss, each action dimension of each step is one "token" whose log-prob
is the Gaussian log-density of the sampled value, so tokens are ``[N, T*A]`` exactly like the small
VLA's; ``batch.tokens`` are unused placeholders (zeros) and the sampled continuous actions travel in
``batch.extras["actions"]`` ``[N, T, A]``. The env clips actions to [-1, 1]; the log-density is of
the unclipped sample (the usual PPO convention for Gaussian policies).

ACT takes no language: instructions are tokenised only to keep the domain's interface (single-task
post-training is ACT's natural use). ``chunk_size=1``: one action per observation, so the policy is
closed-loop at every step as the clipped-ratio loss assumes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from wmrl_vla.policy import InstructionTokenizer

LOG_2PI = math.log(2 * math.pi)


@dataclass
class ACTBridgeConfig:
    image_size: int = 64
    state_dim: int = 7
    action_dim: int = 4
    dim_model: int = 64
    n_heads: int = 4
    dim_feedforward: int = 128
    n_encoder_layers: int = 1
    n_decoder_layers: int = 1
    vision_backbone: str = "resnet18"
    init_log_std: float = -1.0
    min_log_std: float = -4.0
    max_log_std: float = 1.0


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(x; mean, exp(log_std)^2)."""
    return -0.5 * (((x - mean) / log_std.exp()) ** 2) - log_std - 0.5 * LOG_2PI


class GaussianActionHead(nn.Module):
    """Sampling and log-probs of ``a ~ N(mu(o, l), diag(exp(log_std))^2)``, shared by the lerobot
    bridges. A subclass sets ``self.cfg`` (``min_log_std``, ``max_log_std``) and ``self.log_std``, and
    defines :meth:`step_mean`; ``instr`` is part of the inputs only where ``uses_instr``."""

    uses_instr = False

    def step_mean(
        self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor | None
    ) -> torch.Tensor:
        """``[B, A]`` means from images ``[B, 3, H, W]`` uint8, states ``[B, S]``, instruction ids ``[B, L]``."""
        raise NotImplementedError

    def clamped_log_std(self) -> torch.Tensor:
        return self.log_std.clamp(self.cfg.min_log_std, self.cfg.max_log_std)

    def sft_aux_loss(
        self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor | None, actions: torch.Tensor
    ) -> torch.Tensor | float:
        """An extra behaviour-cloning loss of the mean network added by :func:`sft_gaussian` (none here)."""
        return 0.0

    @torch.no_grad()
    def act(
        self,
        images: torch.Tensor,
        states: torch.Tensor,
        instr: torch.Tensor,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(placeholder tokens ``[B, A]`` zeros, log-densities ``[B, A]`` under the untempered policy,
        sampled actions ``[B, A]``); ``temperature`` scales the standard deviation (0: the mean).
        ``noise`` ``[B, A]`` uniforms in (0, 1) replace the generator (inverse normal CDF: common
        random numbers)."""
        if temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0")
        dev = self.log_std.device  # inputs move to the policy's device; outputs come back on the CPU
        instr = instr.to(dev) if instr is not None else None
        mu = self.step_mean(images.to(dev), states.to(dev), instr).cpu()
        log_std = self.clamped_log_std().cpu().expand_as(mu)
        if noise is not None:
            noise = torch.special.ndtri(noise.float().clamp(1e-6, 1 - 1e-6)).reshape(mu.shape)
        else:
            noise = torch.randn(mu.shape, generator=generator)
        a = mu + temperature * log_std.exp() * noise
        return torch.zeros_like(mu, dtype=torch.long), gaussian_log_prob(a, mu, log_std), a

    def log_probs(self, batch, chunk: int = 256) -> torch.Tensor:
        """``[N, T*A]`` Gaussian log-densities of ``extras["actions"]`` (differentiable); padded steps 0."""
        ex = batch.extras
        keys = ("images", "states", "actions", *(("instr",) if self.uses_instr else ()))
        for k in keys:
            if k not in ex:
                raise KeyError(
                    f"batch.extras lacks {k!r}; {type(self).__name__}.log_probs needs {', '.join(keys)}"
                )
        images, states, actions = ex["images"], ex["states"], ex["actions"]
        n, t, a = actions.shape
        step_mask = batch.mask.reshape(n, t, a).amax(-1) > 0
        idx = step_mask.reshape(-1).nonzero().squeeze(-1)
        flat_img = images.reshape(n * t, *images.shape[2:])
        flat_state = states.reshape(n * t, -1)
        flat_instr = ex["instr"].repeat_interleave(t, 0) if self.uses_instr else None
        flat_act = actions.reshape(n * t, a)
        log_std = self.clamped_log_std()
        pieces = []
        for s in range(0, idx.numel(), chunk):
            j = idx[s : s + chunk]
            mu = self.step_mean(flat_img[j], flat_state[j], None if flat_instr is None else flat_instr[j])
            pieces.append(gaussian_log_prob(flat_act[j], mu, log_std.expand_as(mu)))
        out = torch.zeros(n * t, a, device=actions.device)
        if pieces:
            out = out.index_put((idx,), torch.cat(pieces))
        return out.reshape(n, t * a)


class ACTGaussianPolicy(GaussianActionHead):
    """lerobot ACT as the mean of a diagonal Gaussian policy. See the module docstring."""

    def __init__(self, cfg: ACTBridgeConfig) -> None:
        super().__init__()
        from lerobot.configs.types import FeatureType, PolicyFeature
        from lerobot.policies.act.configuration_act import ACTConfig
        from lerobot.policies.act.modeling_act import ACTPolicy

        self.cfg = cfg
        s = cfg.image_size
        act_cfg = ACTConfig(
            input_features={
                "observation.image": PolicyFeature(type=FeatureType.VISUAL, shape=(3, s, s)),
                "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(cfg.state_dim,)),
            },
            output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(cfg.action_dim,))},
            chunk_size=1,
            n_action_steps=1,
            use_vae=False,
            dropout=0.0,  # log-probs must be deterministic for the clipped ratio
            pretrained_backbone_weights=None,
            vision_backbone=cfg.vision_backbone,
            dim_model=cfg.dim_model,
            n_heads=cfg.n_heads,
            dim_feedforward=cfg.dim_feedforward,
            n_encoder_layers=cfg.n_encoder_layers,
            n_decoder_layers=cfg.n_decoder_layers,
            device="cpu",
        )
        self.lerobot_policy = ACTPolicy(act_cfg)
        self.log_std = nn.Parameter(torch.full((cfg.action_dim,), float(cfg.init_log_std)))
        self.tokenizer = InstructionTokenizer()
        self.train()

    def train(self, mode: bool = True) -> ACTGaussianPolicy:
        """BatchNorm layers of ACT's ResNet stay in eval mode (running statistics): a rollout's log-prob
        must not depend on which other rollouts share its minibatch."""
        super().train(mode)
        for m in self.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.eval()
        return self

    def mean(self, images: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """``[B, A]`` Gaussian means from images ``[B, 3, H, W]`` uint8 and states ``[B, S]``."""
        from lerobot.utils.constants import OBS_IMAGES

        s = self.cfg.image_size
        if images.dim() != 4 or images.shape[1:] != (3, s, s):
            raise ValueError(f"images have shape {tuple(images.shape)}, expected [B, 3, {s}, {s}]")
        img = images.float() / 255.0
        batch = {"observation.image": img, "observation.state": states.float(), OBS_IMAGES: [img]}
        actions, _ = self.lerobot_policy.model(batch)  # [B, chunk=1, A]
        return actions[:, 0]

    def step_mean(
        self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor | None
    ) -> torch.Tensor:
        return self.mean(images, states)  # ACT takes no language

    def save(self, path) -> None:
        torch.save({"config": asdict(self.cfg), "state_dict": self.state_dict()}, path)

    @classmethod
    def load(cls, path) -> ACTGaussianPolicy:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        model = cls(ACTBridgeConfig(**ckpt["config"]))
        model.load_state_dict(ckpt["state_dict"])
        return model


def sft_gaussian(
    policy: GaussianActionHead,
    records: Sequence[dict],
    epochs: int = 10,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
) -> list[float]:
    """Behaviour cloning by Gaussian maximum likelihood (fits the mean network and the log std), plus
    the policy's :meth:`~GaussianActionHead.sft_aux_loss` (SmolVLA: its flow-matching loss). Returns
    the per-epoch mean negative log-likelihood per action dimension."""
    from world_models.vla_dynamics import episodes_from_records

    eps = episodes_from_records(records)
    imgs = torch.from_numpy(np.concatenate([e["images"][: len(e["actions"])] for e in eps]))
    sts = torch.from_numpy(np.concatenate([e["states"][: len(e["actions"])] for e in eps]))
    acts = torch.from_numpy(np.concatenate([e["actions"] for e in eps]))
    ins = None
    if policy.uses_instr:
        instr = policy.tokenizer.encode([r["instruction"] for r in records])
        ins = torch.cat([instr[i : i + 1].expand(len(e["actions"]), -1) for i, e in enumerate(eps)])
    dev = policy.log_std.device  # train where the policy lives (--device)
    imgs, sts, acts = imgs.to(dev), sts.to(dev), acts.to(dev)
    ins = ins.to(dev) if ins is not None else None
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr)
    hist = []
    policy.train()
    for _ in range(epochs):
        perm = torch.randperm(len(acts), generator=g)
        tot = 0.0
        for s in range(0, len(acts), batch_size):
            j = perm[s : s + batch_size]
            ins_j = ins[j] if ins is not None else None
            mu = policy.step_mean(imgs[j], sts[j], ins_j)
            nll = -gaussian_log_prob(acts[j], mu, policy.clamped_log_std().expand_as(mu)).mean()
            loss = nll + policy.sft_aux_loss(imgs[j], sts[j], ins_j, acts[j])
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += float(nll.detach()) * len(j)
        hist.append(tot / len(acts))
    policy.eval()
    return hist
