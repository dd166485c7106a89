"""Action-conditioned video/state world model for the VLA domain, as an ensemble.

Dreamer-style split (``observe`` / ``imagine`` / ``loss`` kept apart):

- ``observe``: a CNN encodes the first real frame and proprioception into a latent ``z`` ``[B, D]``
  and keeps the frame's feature maps as *context* for the decoder (the static scene). With
  ``instruction_buckets > 0`` the instruction (hashed words, :func:`instruction_ids`) modulates the
  frame features the latent reads (FiLM), so that the outcome heads know which object the task
  names: in a scene of three discs, "reach the red one" succeeds or fails on the same motion.
- ``imagine``: each of ``K`` members advances the latent with its own residual MLP,
  ``z' = z + f_k(z, a)``, and predicts progress (sigmoid) and a success logit from ``z'``; a shared
  head predicts the next proprioception and a shared frame decoder turns ``z'`` (plus the context
  maps of the first frame) into the next frame. Frames are decoded only where a policy must see them:
  scoring an action sequence runs in latent space (cheap), imagination for a policy decodes.
- ``loss``: open-loop multi-step training on windows of real episodes, so the model is trained the
  way it is used (each member draws its own windows: a bootstrap that gives the members diversity).

Frame decoder ``"deterministic"`` (default) regresses the frame; ``"diffusion"`` adds a small
diffusers ``UNet2DModel`` that samples the next frame with a few DDIM steps, conditioned on the
context frame (channels) and on ``z'`` (an ``identity`` class embedding added to the time embedding).

``outcome_input="state"`` moves the state and outcome heads off the latent
(:class:`GroundedMember`): the proprioception is rolled forward on its own, with a memory, and
progress and success are read from it and the named object's table xy; the latent then only
makes frames. A latent rolled far past its training window drifts, and heads reading it fire at
random on long episodes.

The ensemble's spread of the rollout score is its own uncertainty (``Prediction.var``).

Episodes (what :func:`episodes_from_records` makes from LeRobot records): dicts of numpy arrays
``images`` ``[T+1, 3, H, W]`` uint8 (the frame before each action, plus the last frame if known,
else ``T`` frames), ``states`` ``[T(+1), S]``, ``actions`` ``[T, A]``, ``progress`` ``[T]`` (after each
action), ``success`` ``[T]`` (after each action).
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

FRAME_DECODERS = ("deterministic", "diffusion")
OUTCOME_INPUTS = ("latent", "state")
GOAL_DIM = 2  # the named object's table xy (metres), as the simulator places it at reset


@dataclass
class VLADynamicsConfig:
    image_size: int = 64
    state_dim: int = 8
    action_dim: int = 4
    latent_dim: int = 128
    hidden_dim: int = 256
    # Ensemble members (each its own latent dynamics and outcome heads).
    n_members: int = 3
    # "deterministic" (conv decoder) | "diffusion" (diffusers UNet2DModel + DDIM).
    frame_decoder: str = "deterministic"
    diffusion_steps: int = 4
    diffusion_train_timesteps: int = 100
    # Fraction of the window's frames decoded in the training loss (decoding dominates its cost).
    frame_fraction: float = 0.25
    # Hash buckets of the instruction's words the latent is conditioned on (0: not conditioned).
    instruction_buckets: int = 0
    # What the state and outcome heads read: "latent" (the latent rolled forward: it drifts over a
    # long open-loop horizon) or "state" (proprioception rolled forward on its own, next to the
    # named object's table xy: :class:`GroundedMember`).
    outcome_input: str = "latent"
    # Loss weights.
    frame_weight: float = 1.0
    state_weight: float = 1.0
    outcome_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.frame_decoder not in FRAME_DECODERS:
            raise ValueError(
                f"frame_decoder={self.frame_decoder!r} is not one of {', '.join(FRAME_DECODERS)}"
            )
        if self.image_size % 16 != 0:
            raise ValueError(f"image_size={self.image_size} must be a multiple of 16")
        if self.n_members < 1:
            raise ValueError(f"n_members={self.n_members} must be >= 1")
        if self.outcome_input not in OUTCOME_INPUTS:
            raise ValueError(
                f"outcome_input={self.outcome_input!r} is not one of {', '.join(OUTCOME_INPUTS)}"
            )
        if self.instruction_buckets < 0:
            raise ValueError(f"instruction_buckets={self.instruction_buckets} must be >= 0")


MAX_INSTRUCTION_WORDS = 16


def instruction_ids(texts: Sequence[str], max_words: int = MAX_INSTRUCTION_WORDS) -> torch.Tensor:
    """Instructions -> ``[B, max_words]`` int64: each lower-cased word's CRC32 (+1, so that 0 pads),
    the same on every machine and run; a model folds them into its own buckets."""
    out = torch.zeros(len(texts), max_words, dtype=torch.long)
    for i, text in enumerate(texts):
        words = re.findall(r"[a-z0-9]+", str(text).lower())[:max_words]
        out[i, : len(words)] = torch.tensor([zlib.crc32(w.encode()) + 1 for w in words], dtype=torch.long)
    return out


def _to_unit(images: torch.Tensor) -> torch.Tensor:
    return images.float() / 127.5 - 1.0


def _to_uint8(x: torch.Tensor) -> torch.Tensor:
    return ((x.clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)


class FrameEncoder(nn.Module):
    """``[B, 3, H, W]`` -> feature maps at H/2, H/4, H/8, H/16 and a flat feature."""

    def __init__(self, chans: tuple[int, ...] = (16, 32, 64, 64)) -> None:
        super().__init__()
        self.convs = nn.ModuleList()
        c_in = 3
        for c in chans:
            self.convs.append(nn.Conv2d(c_in, c, 4, stride=2, padding=1))
            c_in = c
        self.chans = chans

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        maps = []
        for conv in self.convs:
            x = F.gelu(conv(x))
            maps.append(x)
        return maps


class FrameDecoder(nn.Module):
    """Latent ``[B, D]`` + context maps of the first frame -> frame ``[B, 3, H, W]`` in [-1, 1].

    A U-Net-style upsampler with non-overlapping 2x2 transposed convolutions, from H/16 to H/2,
    concatenating the first frame's feature map of the same size at each level; the H/2 residual is
    upsampled bilinearly and added to the first frame (the static scene comes through exactly).
    About 9M multiply-adds per 64x64 frame, so imagination that decodes every step stays cheap.
    """

    def __init__(self, latent_dim: int, image_size: int, chans: tuple[int, ...]) -> None:
        super().__init__()
        self.base = image_size // 16
        self.chans = chans
        self.fc = nn.Linear(latent_dim, chans[-1] * self.base * self.base)
        ups = []
        c_prev = chans[-1]
        # levels H/16 -> H/8 -> H/4 -> H/2, each concatenating the context map of the input size
        for i in range(len(chans) - 1, 0, -1):
            c_out = max(chans[i - 1], 16)
            ups.append(nn.ConvTranspose2d(c_prev + chans[i], c_out, 2, stride=2))
            c_prev = c_out
        self.ups = nn.ModuleList(ups)
        self.out = nn.Conv2d(c_prev + chans[0], 3, 3, padding=1)

    def forward(self, z: torch.Tensor, context: list[torch.Tensor], frame0: torch.Tensor) -> torch.Tensor:
        return self.decode(z, self.prepare(context, frame0))

    def prepare(self, context: list[torch.Tensor], frame0: torch.Tensor):
        """What decoding takes from the first frame, computed once per rollout: each level convolves
        ``[x, context map]``, a linear map, so it is the convolution of ``x`` plus that of the context
        map (with the bias), and the latter is the same at every imagined step."""
        consts = [
            F.conv_transpose2d(ctx, up.weight[-ctx.shape[1] :], up.bias, stride=2)
            for up, ctx in zip(self.ups, reversed(context[1:]), strict=True)
        ]
        consts.append(
            F.conv2d(context[0], self.out.weight[:, -context[0].shape[1] :], self.out.bias, padding=1)
        )
        return consts, frame0

    def decode(self, z: torch.Tensor, prepared) -> torch.Tensor:
        """Latent ``[B, D]`` + :meth:`prepare` of its rollout's first frame -> frame in [-1, 1]."""
        consts, frame0 = prepared
        x = F.gelu(self.fc(z)).reshape(z.shape[0], self.chans[-1], self.base, self.base)
        for up, const in zip(self.ups, consts[:-1], strict=True):
            x = F.gelu(F.conv_transpose2d(x, up.weight[: x.shape[1]], None, stride=2) + const)
        # channels last: oneDNN's 3x3 convolution to 3 channels is ~2x faster so on a CPU (same values)
        x = x.contiguous(memory_format=torch.channels_last)
        delta = F.conv2d(x, self.out.weight[:, : x.shape[1]], None, padding=1) + consts[-1]
        return frame0 + F.interpolate(delta, scale_factor=2, mode="bilinear", align_corners=False)


class Member(nn.Module):
    """One ensemble member: latent dynamics and outcome heads."""

    def __init__(self, latent_dim: int, action_dim: int, hidden: int) -> None:
        super().__init__()
        self.dyn = nn.Sequential(
            nn.Linear(latent_dim + action_dim, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, latent_dim),
        )
        self.norm = nn.LayerNorm(latent_dim)
        self.outcome = nn.Sequential(nn.Linear(latent_dim, hidden), nn.GELU(), nn.Linear(hidden, 2))

    def step(self, z: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z2 = self.norm(z + self.dyn(torch.cat([z, a], -1)))
        out = self.outcome(z2)
        return z2, torch.sigmoid(out[:, 0]), out[:, 1]  # latent, progress, success logit


class GroundedMember(nn.Module):
    """One member's state dynamics and outcome heads on proprioception, not on the latent.

    With ``s`` ``[B, S]`` the proprioception (its first two entries: the hand's table xy), ``m``
    ``[B, M]`` a memory (zeros at the rollout's first step), ``a`` ``[B, A]`` the action, ``g``
    ``[B, 2]`` the named object's table xy, ``tip0`` ``[B, 2]`` the hand's xy at the rollout's first
    step and ``e`` ``[B, E]`` the rollout's task embedding (from its first observation's latent,
    constant over the rollout)::

        m'                      = GRU(m, [10 s, a])
        s'                      = s + 0.1 * f([10 s, a, 10 (g - s[:2]), e, m'])
        (progress, success logit) = h([10 s', 10 (g - s'[:2]), 10 (g - tip0), e])

    The memory stands for what proprioception does not show: an action moves the hand's position
    *target*, which the hand follows with a lag, so the target's offset from the hand is a sum over
    past actions that the state alone cannot tell.

    Distances enter in decimetres. The outcome of a step depends on the rolled-out state and the
    object's position only, so it does not inherit the drift of a latent rolled forward past its
    training horizon (the failure that made the latent heads rank long, failing episodes first).
    """

    def __init__(
        self, state_dim: int, action_dim: int, embed_dim: int, hidden: int, memory: int = 32
    ) -> None:
        super().__init__()
        self.memory_dim = memory
        self.memory = nn.GRUCell(state_dim + action_dim, memory)
        self.dyn = nn.Sequential(
            nn.Linear(state_dim + action_dim + GOAL_DIM + embed_dim + memory, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, state_dim),
        )
        self.outcome = nn.Sequential(
            nn.Linear(state_dim + 2 * GOAL_DIM + embed_dim, hidden), nn.GELU(), nn.Linear(hidden, 2)
        )

    def initial_memory(self, s: torch.Tensor) -> torch.Tensor:
        return s.new_zeros(s.shape[0], self.memory_dim)

    def step(
        self,
        s: torch.Tensor,
        m: torch.Tensor,
        a: torch.Tensor,
        g: torch.Tensor,
        tip0: torch.Tensor,
        e: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (next state, next memory, progress, success logit)."""
        m2 = self.memory(torch.cat([10 * s, a], -1), m)
        s2 = s + 0.1 * self.dyn(torch.cat([10 * s, a, 10 * (g - s[:, :GOAL_DIM]), e, m2], -1))
        return (s2, m2, *self.outcome_of(s2, g, tip0, e))

    def outcome_of(
        self, s: torch.Tensor, g: torch.Tensor, tip0: torch.Tensor, e: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(progress ``[B]``, success logit ``[B]``) of a state ``[B, S]``."""
        out = self.outcome(torch.cat([10 * s, 10 * (g - s[:, :GOAL_DIM]), 10 * (g - tip0), e], -1))
        return torch.sigmoid(out[:, 0]), out[:, 1]


class VLADynamics(nn.Module, PyTorchModelHubMixin, library_name="wmrl", tags=["wmrl", "world-model"]):
    """The ensemble world model. See the module docstring.

    ``save_pretrained(DIR)`` / ``VLADynamics.from_pretrained(DIR or hub repo)`` (huggingface_hub's
    ``PyTorchModelHubMixin``): ``model.safetensors`` + ``config.json`` (``{"cfg": ...}``).
    """

    def __init__(self, cfg: VLADynamicsConfig | dict) -> None:
        super().__init__()
        if isinstance(cfg, dict):  # from config.json (from_pretrained)
            cfg = VLADynamicsConfig(**cfg)
        self.cfg = cfg
        chans = (16, 32, 64, 64)
        self.encoder = FrameEncoder(chans)
        feat = chans[-1] * (cfg.image_size // 16) ** 2
        self.to_latent = nn.Sequential(
            nn.Linear(feat + cfg.state_dim, cfg.latent_dim), nn.LayerNorm(cfg.latent_dim)
        )
        self.instruction_film = None
        if cfg.instruction_buckets:
            # mean of the words' (gamma, beta) per channel of the last feature map; zero at the start
            self.instruction_film = nn.EmbeddingBag(
                cfg.instruction_buckets + 1, 2 * chans[-1], mode="mean", padding_idx=0
            )
            nn.init.zeros_(self.instruction_film.weight)
        self.members = nn.ModuleList(
            Member(cfg.latent_dim, cfg.action_dim, cfg.hidden_dim) for _ in range(cfg.n_members)
        )
        self.state_head = nn.Sequential(
            nn.Linear(cfg.latent_dim, cfg.hidden_dim), nn.GELU(), nn.Linear(cfg.hidden_dim, cfg.state_dim)
        )
        self.grounded = None
        if cfg.outcome_input == "state":
            embed = 32
            self.task_embed = nn.Linear(cfg.latent_dim, embed)
            self.grounded = nn.ModuleList(
                GroundedMember(cfg.state_dim, cfg.action_dim, embed, cfg.hidden_dim)
                for _ in range(cfg.n_members)
            )
        self.decoder = FrameDecoder(cfg.latent_dim, cfg.image_size, chans)
        self.unet = None
        if cfg.frame_decoder == "diffusion":
            from diffusers import DDIMScheduler, UNet2DModel

            self.unet = UNet2DModel(
                sample_size=cfg.image_size,
                in_channels=6,
                out_channels=3,
                block_out_channels=(32, 64, 64),
                down_block_types=("DownBlock2D", "DownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "UpBlock2D", "UpBlock2D"),
                layers_per_block=1,
                norm_num_groups=8,
                class_embed_type="identity",
                add_attention=False,
            )
            self.cond_proj = nn.Linear(cfg.latent_dim, 32 * 4)  # time_embed_dim = 4 * block_out_channels[0]
            self.scheduler = DDIMScheduler(num_train_timesteps=cfg.diffusion_train_timesteps)
            self.scheduler.set_timesteps(cfg.diffusion_steps)

    @property
    def device(self) -> torch.device:
        return self.to_latent[0].weight.device

    # ------------------------------------------------------------------ observe
    def observe(self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor | None = None):
        """First frame ``[B, 3, H, W]`` uint8 + state ``[B, S]`` (+ ``instr`` ``[B, L]``, the
        :func:`instruction_ids` of each instruction, for a conditioned model) -> (z ``[B, D]``, context)."""
        s = self.cfg.image_size
        if images.dim() != 4 or images.shape[1:] != (3, s, s):
            raise ValueError(f"images have shape {tuple(images.shape)}, expected [B, 3, {s}, {s}]")
        dev = self.device
        frame0 = _to_unit(images.to(dev))
        maps = self.encoder(frame0)
        feat = maps[-1]
        if self.instruction_film is not None:
            if instr is None or instr.shape[0] != images.shape[0]:
                raise ValueError(
                    f"this world model is conditioned on instructions: pass instr [B={images.shape[0]}, L] "
                    f"(instruction_ids), got {None if instr is None else tuple(instr.shape)}"
                )
            ids = instr.to(dev)
            ids = torch.where(ids > 0, (ids - 1) % self.cfg.instruction_buckets + 1, 0)
            gamma, beta = self.instruction_film(ids).chunk(2, -1)  # [B, C] each
            feat = feat * (1 + gamma[:, :, None, None]) + beta[:, :, None, None]
        z = self.to_latent(torch.cat([feat.flatten(1), states.to(dev).float()], -1))
        return z, (maps, frame0)

    # ------------------------------------------------------------------ decoding
    def decode(self, z: torch.Tensor, context) -> torch.Tensor:
        """Deterministic frame in [-1, 1], ``[B, 3, H, W]``."""
        maps, frame0 = context
        return self.decoder(z, maps, frame0)

    @torch.no_grad()
    def sample_frame(
        self, z: torch.Tensor, context, generator: torch.Generator | None = None, prepared=None
    ) -> torch.Tensor:
        """A frame as uint8 ``[B, 3, H, W]``: decoded, or sampled with DDIM for ``"diffusion"``.
        ``prepared``: ``self.decoder.prepare(*context)``, to reuse over a rollout's steps."""
        if self.unet is None:
            if prepared is None:
                return _to_uint8(self.decode(z, context))
            return _to_uint8(self.decoder.decode(z, prepared))
        _, frame0 = context
        cond = self.cond_proj(z)
        x = torch.randn(frame0.shape, generator=generator).to(frame0.device)
        for t in self.scheduler.timesteps:
            eps = self.unet(torch.cat([x, frame0], 1), t, class_labels=cond).sample
            x = self.scheduler.step(eps, t, x).prev_sample
        return _to_uint8(x)

    def diffusion_loss(self, target: torch.Tensor, z: torch.Tensor, context) -> torch.Tensor:
        """Epsilon-prediction loss of the UNet on target frames ``[B, 3, H, W]`` in [-1, 1]."""
        _, frame0 = context
        noise = torch.randn_like(target)
        t = torch.randint(0, self.cfg.diffusion_train_timesteps, (target.shape[0],), device=target.device)
        noisy = self.scheduler.add_noise(target, noise, t)
        eps = self.unet(torch.cat([noisy, frame0], 1), t, class_labels=self.cond_proj(z.detach())).sample
        return F.mse_loss(eps, noise)

    def grounding(
        self, z0: torch.Tensor, states: torch.Tensor, goal: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """What the grounded heads read besides the state, constant over a rollout: (goal ``[B, 2]``,
        the first step's hand xy ``[B, 2]``, the task embedding ``[B, E]``); None for
        ``outcome_input="latent"``. ``goal``: the named object's table xy at reset (the simulator's
        placement, what :func:`wmrl_vla.rollout.goal_xy` reads), in metres."""
        if self.grounded is None:
            return None
        b = z0.shape[0]
        if goal is None or tuple(goal.shape) != (b, GOAL_DIM):
            raise ValueError(
                f"this world model's outcome heads read the named object's position (outcome_input="
                f"'state'): pass goal [B={b}, {GOAL_DIM}], got {None if goal is None else tuple(goal.shape)}"
            )
        return goal.to(z0.device).float(), states.to(z0.device).float()[:, :GOAL_DIM], self.task_embed(z0)

    # ------------------------------------------------------------------ scoring
    def score_actions(
        self,
        images: torch.Tensor,
        states: torch.Tensor,
        actions: torch.Tensor,
        mask: torch.Tensor,
        instr: torch.Tensor | None = None,
        goal: torch.Tensor | None = None,
    ):
        """Rollout of action sequences under every member, in latent space (or, for
        ``outcome_input="state"``, in proprioception: no latent is rolled forward).

        images ``[B, 3, H, W]`` uint8 and states ``[B, S]``: the first observation; actions
        ``[B, T, A]``; mask ``[B, T]`` (1 on real steps); instr ``[B, L]`` (see :meth:`observe`);
        goal ``[B, 2]`` (see :meth:`grounding`). Returns progress ``[K, B, T]`` and success
        probabilities ``[K, B, T]`` (0 after the mask ends), on the model's device.
        """
        z0, _ = self.observe(images, states, instr)
        actions, mask = actions.to(z0.device), mask.to(z0.device)
        ground = self.grounding(z0, states, goal)
        progs, succs = [], []
        for k, m in enumerate(self.members):
            z, s, p_k, s_k = z0, states.to(z0.device).float(), [], []
            mem = None if ground is None else self.grounded[k].initial_memory(s)
            for t in range(actions.shape[1]):
                a = actions[:, t].float()
                if ground is None:
                    z, p, logit = m.step(z, a)
                else:
                    s, mem, p, logit = self.grounded[k].step(s, mem, a, *ground)
                p_k.append(p)
                s_k.append(torch.sigmoid(logit))
            progs.append(torch.stack(p_k, 1) * mask)
            succs.append(torch.stack(s_k, 1) * mask)
        return torch.stack(progs), torch.stack(succs)

    @torch.no_grad()
    def frames_from_latents(
        self, images: torch.Tensor, z: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """uint8 frames ``[M, 3, H, W]`` decoded (or sampled) from latents ``z`` ``[M, D]`` of rollouts
        whose first frames are ``images`` ``[M, 3, H, W]`` uint8 (the decoder's context), as
        :meth:`imagine` decodes them."""
        if z.dim() != 2 or z.shape[0] != images.shape[0]:
            raise ValueError(f"z has shape {tuple(z.shape)}, expected ({images.shape[0]}, D)")
        frame0 = _to_unit(images.to(self.device))
        return self.sample_frame(z.to(self.device), (self.encoder(frame0), frame0), generator)

    # ------------------------------------------------------------------ imagination
    @torch.no_grad()
    def imagine(
        self,
        images: torch.Tensor,
        states: torch.Tensor,
        policy: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
        horizon: int,
        members: torch.Tensor | None = None,
        success_threshold: float = 0.5,
        generator: torch.Generator | None = None,
        observe: str = "frames",
        instr: torch.Tensor | None = None,
        goal: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Roll a whole batch forward together; the policy acts on predicted frames (``instr``: see
        :meth:`observe`; ``goal``: see :meth:`grounding`). With ``outcome_input="state"`` the
        states the policy gets and the outcomes come from the grounded heads.

        ``policy(images [B, 3, H, W] uint8, states [B, S], t) -> actions [B, A]`` (it may record
        whatever else it needs). Rollout ``i`` follows member ``members[i]`` (default ``i % K``) and
        ends after the first step whose success probability passes ``success_threshold``.
        ``observe="latents"``: the policy gets the latent ``z`` ``[B, D]`` in place of the frame and no
        frame is decoded (``images`` then holds the first frame at every step).

        Returns ``images`` ``[B, T, 3, H, W]`` (the frames the policy saw), ``latents`` ``[B, T, D]``
        (the latent of each of those steps), ``states`` ``[B, T, S]``, ``actions`` ``[B, T, A]``,
        ``progress`` / ``success`` ``[B, T]`` (the member's predictions after each action) and
        ``mask`` ``[B, T]``, all on the CPU. The model runs on its own device; ``policy`` gets frames
        (or latents) and states there and may return actions on any device.
        """
        if observe not in ("frames", "latents"):
            raise ValueError(f"observe={observe!r} is not one of frames, latents")
        decode = observe == "frames"
        b = images.shape[0]
        k = self.cfg.n_members
        dev = self.device
        members = torch.arange(b, device=dev) % k if members is None else members.to(dev)
        z, context = self.observe(images, states, instr)
        prepared = self.decoder.prepare(*context) if self.unet is None and decode else None
        frame, state = images.to(dev), states.to(dev).float()
        ground = self.grounding(z, states, goal)
        mem = None if ground is None else self.grounded[0].initial_memory(state)
        alive = torch.ones(b, dtype=torch.bool, device=dev)
        out = {n: [] for n in ("images", "latents", "states", "actions", "progress", "success", "mask")}
        for t in range(horizon):
            out["images"].append(frame)
            out["latents"].append(z)
            out["states"].append(state)
            out["mask"].append(alive.float())
            a = policy(frame if decode else z, state, t).to(dev).float()  # [B, A]
            z_next = torch.empty_like(z)
            s_next = torch.empty_like(state)
            mem_next = None if mem is None else torch.empty_like(mem)
            prog = torch.empty(b, device=dev)
            succ = torch.empty(b, device=dev)
            for j, m in enumerate(self.members):
                sel = (members == j).nonzero().squeeze(-1)
                if sel.numel():
                    z_next[sel], prog[sel], logit = m.step(z[sel], a[sel])
                    if ground is not None:
                        s_next[sel], mem_next[sel], prog[sel], logit = self.grounded[j].step(
                            state[sel], mem[sel], a[sel], *(x[sel] for x in ground)
                        )
                    succ[sel] = torch.sigmoid(logit)
            out["actions"].append(a)
            out["progress"].append(prog * alive)
            out["success"].append(succ * alive)
            alive = alive & (succ < success_threshold)
            z = z_next
            if t + 1 < horizon:
                state, mem = (self.state_head(z), None) if ground is None else (s_next, mem_next)
                if decode:
                    frame = self.sample_frame(z, context, generator, prepared)
            if not alive.any():
                # pad the remaining steps with copies (masked out)
                for _ in range(t + 1, horizon):
                    for n in out:
                        out[n].append(
                            out[n][-1]
                            if n not in ("mask", "progress", "success")
                            else torch.zeros(b, device=dev)
                        )
                break
        return {n: torch.stack(v, 1).cpu() for n, v in out.items()}

    # ------------------------------------------------------------------ training
    def loss(
        self, batch: dict[str, torch.Tensor], member_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict]:
        """Open-loop multi-step loss on windows.

        ``batch``: ``images`` ``[B, H+1, 3, h, w]`` uint8, ``states`` ``[B, H+1, S]``, ``actions``
        ``[B, H, A]``, ``progress``/``success`` ``[B, H]``, ``frame_mask`` ``[B, H]`` (1 where the next
        frame is known), ``step_mask`` ``[B, H]`` (1 on real steps), ``instr`` ``[B, L]``. Row ``i``
        trains member ``member_ids[i]`` (default: every member on every row). The grounded heads of
        ``outcome_input="state"`` train on their own windows (:meth:`grounded_loss`).
        """
        imgs, sts, acts = batch["images"], batch["states"], batch["actions"]
        b, h = acts.shape[:2]
        z0, context = self.observe(imgs[:, 0], sts[:, 0], batch.get("instr"))
        step_mask = batch["step_mask"].float()
        frame_mask = batch["frame_mask"].float() * step_mask
        target_frames = _to_unit(imgs[:, 1:])  # [B, H, 3, h, w]
        losses = {"frame": 0.0, "state": 0.0, "progress": 0.0, "success": 0.0, "diffusion": 0.0}
        n_members = len(self.members)
        for j, m in enumerate(self.members):
            rows = _member_rows(member_ids, j, b, z0.device)
            if rows.numel() == 0:
                continue
            z = z0[rows]
            ctx = ([mp[rows] for mp in context[0]], context[1][rows])
            zs, ps, ls = [], [], []
            for t in range(h):
                z, p, logit = m.step(z, acts[rows, t].float())
                zs.append(z)
                ps.append(p)
                ls.append(logit)
            zs_t = torch.stack(zs, 1)  # [b_j, H, D]
            sm, fm = step_mask[rows], frame_mask[rows]
            denom = sm.sum().clamp(min=1)
            losses["progress"] = (
                losses["progress"]
                + (((torch.stack(ps, 1) - batch["progress"][rows].float()) ** 2) * sm).sum() / denom
            )
            bce = F.binary_cross_entropy_with_logits(
                torch.stack(ls, 1), batch["success"][rows].float(), reduction="none"
            )
            losses["success"] = losses["success"] + (bce * sm).sum() / denom
            st_err = ((self.state_head(zs_t) - sts[rows, 1:].float()) ** 2).mean(-1)
            losses["state"] = losses["state"] + (st_err * fm).sum() / fm.sum().clamp(min=1)
            flat = fm.reshape(-1).nonzero().squeeze(-1)
            if self.training and self.cfg.frame_fraction < 1 and flat.numel() > 1:
                keep = max(1, int(round(flat.numel() * self.cfg.frame_fraction)))
                flat = flat[torch.randperm(flat.numel())[:keep]]
            if flat.numel():
                zf = zs_t.reshape(-1, zs_t.shape[-1])[flat]
                rep = flat // h  # row (within rows) of each frame
                ctx_f = ([mp[rep] for mp in ctx[0]], ctx[1][rep])
                target = target_frames[rows].reshape(-1, *target_frames.shape[2:])[flat]
                losses["frame"] = losses["frame"] + F.mse_loss(self.decode(zf, ctx_f), target)
                if self.unet is not None:
                    losses["diffusion"] = losses["diffusion"] + self.diffusion_loss(target, zf, ctx_f)
        c = self.cfg
        total = (
            c.frame_weight * (losses["frame"] + losses["diffusion"])
            + c.state_weight * losses["state"]
            + c.outcome_weight * (losses["progress"] + losses["success"])
        ) / n_members
        return total, {
            f"wm/loss_{k}": float(v.detach() if torch.is_tensor(v) else v) / n_members
            for k, v in losses.items()
        }

    def grounded_loss(
        self, batch: dict[str, torch.Tensor], member_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict]:
        """Loss of the grounded heads (``outcome_input="state"``) on windows that may span whole
        episodes (only their first frame is read: ``images`` ``[B, 1 or H+1, 3, h, w]``; the other
        keys as :meth:`loss`, with ``goal`` and ``tip0`` ``[B, 2]``).

        - ``state``: the state rolled open-loop from the window's first real state (with zero memory,
          as at an episode's start, where the hand's target is the hand: train on windows from the
          start, ``sample_windows(from_start=True)``) against the real states, absolute error in
          centimetres, mean over dimensions (bounded gradients: the squared error in centimetres
          of an untrained 50-step rollout is in the thousands);
        - ``progress`` / ``success``: squared error and cross-entropy of the outcome heads both on the
          rolled state (what scoring uses) and on the real state (teacher forcing: every real step
          labels the outcome function itself, whatever the rollout's drift).
        """
        imgs, sts, acts = batch["images"], batch["states"], batch["actions"]
        b, h = acts.shape[:2]
        z0, _ = self.observe(imgs[:, 0], sts[:, 0], batch.get("instr"))
        ground = (batch["goal"].float(), batch["tip0"].float(), self.task_embed(z0))
        step_mask = batch["step_mask"].float()
        known = batch["frame_mask"].float() * step_mask  # the real next state is known
        losses = {"state": 0.0, "progress": 0.0, "success": 0.0}
        for j, gm in enumerate(self.grounded):
            rows = _member_rows(member_ids, j, b, z0.device)
            if rows.numel() == 0:
                continue
            g_rows = tuple(x[rows] for x in ground)
            s, rolled, ps, ls = sts[rows, 0].float(), [], [], []
            mem = gm.initial_memory(s)
            for t in range(h):
                s, mem, p, logit = gm.step(s, mem, acts[rows, t].float(), *g_rows)
                rolled.append(s)
                ps.append(p)
                ls.append(logit)
            real_next = sts[rows, 1:].float()  # [b_j, H, S]
            p_tf, l_tf = gm.outcome_of(real_next.flatten(0, 1), *(x.repeat_interleave(h, 0) for x in g_rows))
            sm, km = step_mask[rows], known[rows]
            prog, succ = batch["progress"][rows].float(), batch["success"][rows].float()
            for p_k, l_k, mk in ((torch.stack(ps, 1), torch.stack(ls, 1), sm),
                                 (p_tf.view(-1, h), l_tf.view(-1, h), km)):  # fmt: skip
                denom = mk.sum().clamp(min=1)
                losses["progress"] = losses["progress"] + (((p_k - prog) ** 2) * mk).sum() / denom
                bce = F.binary_cross_entropy_with_logits(l_k, succ, reduction="none")
                losses["success"] = losses["success"] + (bce * mk).sum() / denom
            st_err = ((torch.stack(rolled, 1) - real_next) * 100).abs().mean(-1)
            losses["state"] = losses["state"] + (st_err * km).sum() / km.sum().clamp(min=1)
        c = self.cfg
        total = c.state_weight * losses["state"] + c.outcome_weight * (losses["progress"] + losses["success"])
        total = total / len(self.grounded)
        return total, {
            f"wm/grounded_loss_{k}": float(v.detach() if torch.is_tensor(v) else v) / len(self.grounded)
            for k, v in losses.items()
        }

    # ------------------------------------------------------------------ persistence
    def save(self, path) -> None:
        torch.save({"config": asdict(self.cfg), "state_dict": self.state_dict()}, path)

    @classmethod
    def load(cls, path) -> VLADynamics:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        model = cls(VLADynamicsConfig(**ckpt["config"]))
        model.load_state_dict(ckpt["state_dict"])
        return model


def _member_rows(member_ids: torch.Tensor | None, j: int, b: int, device) -> torch.Tensor:
    """The rows of a batch of ``b`` that member ``j`` trains on: all of them without ``member_ids``."""
    if member_ids is None:
        return torch.arange(b, device=device)
    return (member_ids.to(device) == j).nonzero().squeeze(-1)


# ---------------------------------------------------------------------- rollout score
def rollout_score(progress: torch.Tensor, success: torch.Tensor, success_weight: float = 0.5) -> torch.Tensor:
    """The rollout reward, from per-step progress and success (probabilities or 0/1), ``[..., T]`` -> ``[...]``.

    ``r = w * max_t success_t + (1 - w) * max_t progress_t``: the real reward of a rollout applies the
    same function to the simulator's progress and success flags.
    """
    return success_weight * success.amax(-1) + (1.0 - success_weight) * progress.amax(-1)


# ---------------------------------------------------------------------- calibration
def fit_variance_calibration(sq_err, var, min_pairs: int = 4) -> tuple[float, float]:
    """Scale ``a`` and floor ``b`` of the calibrated variance ``v' = a * var + b`` of the rollout score.

    Fitted by the Gaussian negative log-likelihood ``sum_i log v'_i + e_i^2 / v'_i`` over held-out
    pairs (``sq_err`` ``[n]``: squared error of the ensemble's mean score against the real reward,
    ``var`` ``[n]``: the ensemble's variance there; both numpy-like). With the floor at 0 the optimum
    is ``a = mean(e^2 / var)``, i.e. mean z^2 = 1 on the pairs; the floor keeps a rollout the members
    agree on from claiming near-zero error. ``(1, 0)`` (the raw variance) with fewer than
    ``min_pairs`` pairs.
    """
    from scipy.optimize import minimize

    e2 = np.asarray(sq_err, dtype=np.float64).reshape(-1)
    v = np.asarray(var, dtype=np.float64).reshape(-1)
    ok = np.isfinite(e2) & np.isfinite(v) & (v >= 0)
    e2, v = e2[ok], v[ok]
    if len(e2) < min_pairs:
        return 1.0, 0.0
    scale = max(float(e2.mean()), 1e-8)

    def nll(x: np.ndarray) -> float:
        vc = np.exp(x[0]) * v + np.exp(x[1])
        return float(np.mean(np.log(vc) + e2 / vc))

    x0 = np.log([scale / max(float(v.mean()), 1e-12), 0.1 * scale])
    res = minimize(nll, x0, method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-8, "maxiter": 400})
    return float(np.exp(res.x[0])), float(np.exp(res.x[1]))


def calibration_stats(sq_err, var, scale: float = 1.0, floor: float = 0.0) -> dict[str, float]:
    """``z2_mean`` = mean e^2 / v' (1 = calibrated, > 1 over-confident), ``z2_median`` and the
    Gaussian NLL of the errors under ``v' = scale * var + floor``, over finite pairs."""
    e2 = np.asarray(sq_err, dtype=np.float64).reshape(-1)
    v = np.asarray(var, dtype=np.float64).reshape(-1)
    ok = np.isfinite(e2) & np.isfinite(v)
    vc = np.maximum(scale * v[ok] + floor, 1e-8)
    z2 = e2[ok] / vc
    if not len(z2):
        return {"z2_mean": float("nan"), "z2_median": float("nan"), "nll": float("nan"), "n": 0}
    return {
        "z2_mean": float(z2.mean()),
        "z2_median": float(np.median(z2)),
        "nll": float(0.5 * np.mean(np.log(2 * np.pi * vc) + z2)),
        "n": int(len(z2)),
    }


# ---------------------------------------------------------------------- data
def episodes_from_records(records: Sequence[dict]) -> list[dict[str, np.ndarray]]:
    """LeRobot-style records (``observation.image`` ``[T(+1), H, W, 3]`` or ``[T(+1), 3, H, W]``,
    ``observation.state``, ``action``, ``next.reward``, ``next.success``; or the short names of
    :func:`wmrl_vla.data.load_episodes`: ``image``, ``state``, ``reward``, ``success``) -> episodes."""

    def pick(r: dict, *keys: str):
        for k in keys:
            if k in r:
                return r[k]
        raise KeyError(f"episode record has none of {keys} (keys: {sorted(r)})")

    eps = []
    for r in records:
        img = np.asarray(pick(r, "observation.image", "image"))
        if img.ndim != 4:
            raise ValueError(f"observation.image must be [T, H, W, 3] or [T, 3, H, W], got {img.shape}")
        if img.shape[-1] == 3 and img.shape[1] != 3:
            img = img.transpose(0, 3, 1, 2)
        if img.dtype != np.uint8:
            img = (
                (np.clip(img, 0, 1) * 255).round().astype(np.uint8)
                if img.max() <= 1.0
                else img.astype(np.uint8)
            )
        eps.append(
            {
                "images": img,
                "states": np.asarray(pick(r, "observation.state", "state"), dtype=np.float32),
                "actions": np.asarray(pick(r, "action"), dtype=np.float32),
                "progress": np.asarray(pick(r, "next.reward", "reward"), dtype=np.float32).reshape(-1),
                "success": np.asarray(pick(r, "next.success", "success"), dtype=np.float32).reshape(-1),
                "instruction": str(r.get("instruction", r.get("task", ""))),
                **({"goal": np.asarray(r["goal"], dtype=np.float32)[:GOAL_DIM]} if "goal" in r else {}),
            }
        )
    return eps


def sample_windows(
    episodes: Sequence[dict],
    n: int,
    horizon: int,
    rng: np.random.Generator,
    frames: bool = True,
    from_start: bool = False,
) -> dict[str, torch.Tensor]:
    """``n`` windows of ``horizon`` steps (padded where an episode ends) for :meth:`VLADynamics.loss`;
    ``frames=False``: ``images`` holds each window's first frame only (``[n, 1, 3, h, w]``, for
    :meth:`VLADynamics.grounded_loss`); ``from_start``: every window starts at its episode's first step."""
    if not episodes:
        raise ValueError("sample_windows needs at least one episode")
    h = horizon
    ex = episodes[0]
    img_shape, s_dim, a_dim = ex["images"].shape[1:], ex["states"].shape[1], ex["actions"].shape[1]
    images = np.zeros((n, h + 1 if frames else 1, *img_shape), np.uint8)
    states = np.zeros((n, h + 1, s_dim), np.float32)
    actions = np.zeros((n, h, a_dim), np.float32)
    prog = np.zeros((n, h), np.float32)
    succ = np.zeros((n, h), np.float32)
    fmask = np.zeros((n, h), np.float32)
    smask = np.zeros((n, h), np.float32)
    goal = np.zeros((n, GOAL_DIM), np.float32)
    tip0 = np.zeros((n, GOAL_DIM), np.float32)
    texts = []
    for i in range(n):
        e = episodes[rng.integers(len(episodes))]
        texts.append(e.get("instruction", ""))
        if "goal" in e:
            goal[i] = e["goal"]
        tip0[i] = e["states"][0, :GOAL_DIM]
        t_len = len(e["actions"])
        t0 = 0 if from_start else int(rng.integers(t_len))
        steps = min(h, t_len - t0)
        n_frames = min(h + 1, len(e["images"]) - t0)
        images[i, : n_frames if frames else 1] = e["images"][t0 : t0 + (n_frames if frames else 1)]
        states[i, :n_frames] = e["states"][t0 : t0 + n_frames]
        actions[i, :steps] = e["actions"][t0 : t0 + steps]
        prog[i, :steps] = e["progress"][t0 : t0 + steps]
        succ[i, :steps] = e["success"][t0 : t0 + steps]
        smask[i, :steps] = 1
        fmask[i, : max(n_frames - 1, 0)] = 1
    return {
        "images": torch.from_numpy(images),
        "states": torch.from_numpy(states),
        "actions": torch.from_numpy(actions),
        "progress": torch.from_numpy(prog),
        "success": torch.from_numpy(succ),
        "frame_mask": torch.from_numpy(fmask),
        "step_mask": torch.from_numpy(smask),
        "instr": instruction_ids(texts),
        "goal": torch.from_numpy(goal),
        "tip0": torch.from_numpy(tip0),
    }


def episode_goals(eps: Sequence[dict]) -> torch.Tensor:
    """``[E, 2]``: each episode's ``goal`` (the named object's table xy; zeros where unknown)."""
    return torch.from_numpy(
        np.stack([np.asarray(e.get("goal", np.zeros(GOAL_DIM)), np.float32) for e in eps])
    )


def train_dynamics(
    model: VLADynamics,
    episodes: Sequence[dict],
    steps: int,
    batch_size: int = 32,
    horizon: int = 8,
    lr: float = 1e-3,
    seed: int = 0,
    optimizer: torch.optim.Optimizer | None = None,
    progress: bool = False,
    state_horizon: int = 50,
) -> tuple[torch.optim.Optimizer, list[float]]:
    """``steps`` Adam steps on random windows; each row trains one member (bootstrap). A grounded
    model's heads also train at every step on ``batch_size`` windows of ``state_horizon`` steps
    (:meth:`VLADynamics.grounded_loss`: no frame decoded, so whole episodes are cheap). Returns the
    optimizer (to keep for online refinement) and the loss history."""
    from tqdm.auto import tqdm

    rng = np.random.default_rng(seed)
    opt = optimizer or torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    hist = []
    it = tqdm(range(steps), desc="world model", disable=not progress)
    k = model.cfg.n_members
    for _ in it:
        batch = {n: v.to(model.device) for n, v in sample_windows(episodes, batch_size, horizon, rng).items()}
        member_ids = torch.from_numpy(rng.integers(k, size=batch_size)) if k > 1 else None
        loss, _ = model.loss(batch, member_ids)
        if model.grounded is not None:
            long = sample_windows(episodes, batch_size, state_horizon, rng, frames=False, from_start=True)
            g_ids = torch.from_numpy(rng.integers(k, size=batch_size)) if k > 1 else None
            loss = loss + model.grounded_loss({n: v.to(model.device) for n, v in long.items()}, g_ids)[0]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        hist.append(float(loss.detach()))
        it.set_postfix(loss=f"{hist[-1]:.4f}")
    model.eval()
    return opt, hist


# ---------------------------------------------------------------------- quality
def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    # Mann-Whitney U with ties counted half
    greater = (pos[:, None] > neg[None, :]).mean()
    ties = (pos[:, None] == neg[None, :]).mean()
    return float(greater + 0.5 * ties)


@torch.no_grad()
def evaluate_dynamics(
    model: VLADynamics, episodes: Sequence[dict], horizon: int = 16, max_windows: int = 64, seed: int = 0
) -> dict[str, float]:
    """Quality on held-out real episodes.

    - ``next_frame_mse`` / ``next_frame_psnr``: one step from a real frame (pixels in [0, 1]).
    - ``frame_mse_step{k}`` and ``error_growth``: open-loop error at steps 1, 2, 4, 8, ... of the
      horizon, and the ratio last/first.
    - ``state_mse_step1``.
    - ``success_auc``: per-episode predicted score (open-loop from the first frame, real actions) vs
      real success; ``score_mae`` / ``score_corr`` against the real rollout score.
    - ``var_error_corr``: Spearman correlation between ensemble variance and squared score error
      (calibration of the ensemble's own uncertainty); ``z2_mean``: mean squared error / variance
      (1 = calibrated, >1 over-confident).
    """
    model.eval()
    rng = np.random.default_rng(seed)
    w = {n: v.to(model.device) for n, v in sample_windows(episodes, max_windows, horizon, rng).items()}
    z, ctx = model.observe(w["images"][:, 0], w["states"][:, 0], w["instr"])
    ground = model.grounding(z, w["states"][:, 0], w["goal"])
    member = model.members[0]
    mse_steps, state_mse1 = [], None
    targets = _to_unit(w["images"][:, 1:])
    fm = w["frame_mask"]
    for t in range(horizon):
        z, _, _ = member.step(z, w["actions"][:, t])  # open loop along member 0
        pred = model.sample_frame(z, ctx).float() / 127.5 - 1.0
        err = (((pred - targets[:, t]) / 2) ** 2).mean((1, 2, 3))  # pixels in [0, 1]
        valid = fm[:, t] > 0
        mse_steps.append(float(err[valid].mean()) if valid.any() else float("nan"))
        if t == 0:
            s1 = (
                model.state_head(z)
                if ground is None
                else model.grounded[0].step(
                    w["states"][:, 0],
                    model.grounded[0].initial_memory(w["states"][:, 0]),
                    w["actions"][:, 0],
                    *ground,
                )[0]
            )
            se = ((s1 - w["states"][:, 1]) ** 2).mean(-1)
            state_mse1 = float(se[valid].mean()) if valid.any() else float("nan")
    out: dict[str, float] = {
        "next_frame_mse": mse_steps[0],
        "next_frame_psnr": 10 * math.log10(1.0 / max(mse_steps[0], 1e-10)),
        "state_mse_step1": state_mse1,
    }
    k = 1
    while k <= horizon:
        out[f"frame_mse_step{k}"] = mse_steps[k - 1]
        k *= 2
    finite = [m for m in mse_steps if not math.isnan(m)]
    out["error_growth"] = finite[-1] / max(finite[0], 1e-10) if finite else float("nan")

    # whole-episode scores from the first frame with the real action sequence
    eps = list(episodes)[:max_windows]
    scores, real, label = score_episodes(model, eps)
    mean, var = (
        scores.mean(0),
        scores.var(0, unbiased=False) if scores.shape[0] > 1 else torch.zeros(len(eps)),
    )
    sq = (mean - real) ** 2
    out["success_auc"] = _auc(mean.numpy(), label)
    out["score_mae"] = float((mean - real).abs().mean())
    out["score_corr"] = (
        float(np.corrcoef(mean.numpy(), real.numpy())[0, 1])
        if len(real) > 1 and float(real.std()) > 0
        else float("nan")
    )
    if scores.shape[0] > 1:
        from scipy.stats import spearmanr

        out["var_error_corr"] = float(spearmanr(var.numpy(), sq.numpy()).statistic)
        out["z2_mean"] = float((sq / var.clamp(min=1e-8)).mean())
        out["ensemble_std_mean"] = float(var.sqrt().mean())
        # the variance calibration fitted on these episodes (VLAWorldModel starts from it)
        out["var_scale"], out["var_floor"] = fit_variance_calibration(sq.numpy(), var.numpy())
        out["z2_mean_calibrated_in_sample"] = calibration_stats(
            sq.numpy(), var.numpy(), out["var_scale"], out["var_floor"]
        )["z2_mean"]
    return out


@torch.no_grad()
def score_episodes(model: VLADynamics, eps: Sequence[dict]) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Every member's score of each episode's real action sequence, imagined in latent space from
    its first frame: (scores ``[K, E]``, real rollout scores ``[E]``, real success ``[E]`` in {0, 1})."""
    t_max = max(len(e["actions"]) for e in eps)
    a_dim = eps[0]["actions"].shape[1]
    acts = torch.zeros(len(eps), t_max, a_dim)
    mask = torch.zeros(len(eps), t_max)
    real = torch.zeros(len(eps))
    label = np.zeros(len(eps))
    for i, e in enumerate(eps):
        n = len(e["actions"])
        acts[i, :n] = torch.from_numpy(e["actions"])
        mask[i, :n] = 1
        real[i] = rollout_score(torch.from_numpy(e["progress"]), torch.from_numpy(e["success"]))
        label[i] = float(e["success"].max() > 0.5)
    imgs = torch.from_numpy(np.stack([e["images"][0] for e in eps]))
    sts = torch.from_numpy(np.stack([e["states"][0] for e in eps]))
    instr = instruction_ids([e.get("instruction", "") for e in eps])
    prog, succ = model.score_actions(imgs, sts, acts, mask, instr, episode_goals(eps))
    return rollout_score(prog.cpu(), succ.cpu()), real, label
