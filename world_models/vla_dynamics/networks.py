"""The world model's building blocks: frame encoder and decoder, the latent member, the grounded
member (see the package docstring, :mod:`world_models.vla_dynamics`)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from world_models.vla_dynamics.config import GOAL_DIM, HAND_DIM

GEOMETRY_DIM = GOAL_DIM + 2  # the hand's offset to the goal, its length and the hand's height


class Grounding(NamedTuple):
    """What a grounded member reads besides the state, constant over a rollout (each ``[B, .]``)."""

    goal: torch.Tensor  # [B, 2] the named object's table xy at reset (metres)
    tip0: torch.Tensor  # [B, 2] the hand's xy at the rollout's first step
    scene: torch.Tensor  # [B, E] the task embedding of the first observation's latent (the dynamics')
    task: torch.Tensor  # [B, E] what the outcome heads know of the task: ``scene``, or the instruction's

    def rows(self, index: torch.Tensor) -> Grounding:
        return Grounding(*(x[index] for x in self))

    def per_step(self, t: int) -> Grounding:
        """Each row repeated ``t`` times ``[B * t, .]``: the grounding of a ``[B, t]`` roll's states,
        flattened row-major."""
        return Grounding(*(x.repeat_interleave(t, 0) for x in self))


def to_unit(images: torch.Tensor) -> torch.Tensor:
    return images.float() / 127.5 - 1.0


def to_uint8(x: torch.Tensor) -> torch.Tensor:
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

    With ``s`` ``[B, S]`` the proprioception (its first three entries: the hand's xyz), ``m``
    ``[B, M]`` a memory (zeros at the rollout's first step), ``a`` ``[B, A]`` the action and the
    :class:`Grounding` ``g`` (the named object's table xy), ``tip0`` (the hand's xy at the rollout's
    first step), ``e`` (the scene's task embedding) and ``c`` (the outcome heads' task embedding)::

        m'                      = GRU(m, [10 s, a])
        s'                      = s + 0.1 * f([10 s, a, 10 (g - s[:2]), e, m'])
        (progress, success logit) = h([10 s', 10 (g - s'[:2]), 10 (g - tip0), c])

    The memory stands for what proprioception does not show: an action moves the hand's position
    *target*, which the hand follows with a lag, so the target's offset from the hand is a sum over
    past actions that the state alone cannot tell.

    With ``integrator=True`` the memory also carries that sum explicitly, a learned integrator
    ``tau`` ``[B, 3]`` in the hand's coordinates, started at the hand and clamped to the range of
    hand positions seen in the training data (``lo``, ``hi`` ``[3]``, :meth:`widen_range`,
    unclamped before any; a target never leaves the workspace)::

        tau'                    = clamp(tau + B a, lo, hi)          (B [3, A], learned, zero at start)
        s'                      = s + 0.1 * f([10 s, a, 10 (g - s[:2]), e, m', 10 (tau' - s[:3])])

    A GRU must learn to keep such a sum over 50 steps; an integrator keeps it by construction, so the
    rolled hand need not drift (``memory`` ``[B, M + 3]`` then: the GRU's state, then ``tau``).

    With ``geometric=True`` the outcome heads also read the hand's offset to the goal, its length and
    the hand's height in centimetres, where a press or a reach is decided (a success and a failure of
    a press are 2 and 5 cm from the button)::

        h([10 s', 10 (g - s'[:2]), 10 (g - tip0), c, 100 (g - s'[:2]), 100 |g - s'[:2]|, 100 s'[2]])

    Distances enter in decimetres otherwise. The outcome of a step depends on the rolled-out state and
    the object's position only, so it does not inherit the drift of a latent rolled forward past its
    training horizon (the failure that made the latent heads rank long, failing episodes first).
    """

    def __init__(
        self,
        state_dim: int,
        action_dim: int,
        embed_dim: int,
        hidden: int,
        memory: int = 32,
        integrator: bool = False,
        geometric: bool = False,
    ) -> None:
        super().__init__()
        self.memory_dim = memory
        self.geometric = geometric
        self.memory = nn.GRUCell(state_dim + action_dim, memory)
        self.integrator = None
        if integrator:
            self.integrator = nn.Linear(action_dim, HAND_DIM, bias=False)
            nn.init.zeros_(self.integrator.weight)
            self.register_buffer("lo", torch.full((HAND_DIM,), float("inf")))
            self.register_buffer("hi", torch.full((HAND_DIM,), float("-inf")))
        self.dyn = nn.Sequential(
            nn.Linear(state_dim + action_dim + GOAL_DIM + embed_dim + memory + HAND_DIM * integrator, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, state_dim),
        )
        self.outcome = nn.Sequential(
            nn.Linear(state_dim + 2 * GOAL_DIM + embed_dim + GEOMETRY_DIM * geometric, hidden),
            nn.GELU(),
            nn.Linear(hidden, 2),
        )

    def initial_memory(self, s: torch.Tensor) -> torch.Tensor:
        """The memory at a rollout's first step ``[B, M]`` (``[B, M + 3]`` with the integrator, whose
        target starts at the hand), from its first state ``s`` ``[B, S]``."""
        gru = s.new_zeros(s.shape[0], self.memory_dim)
        return gru if self.integrator is None else torch.cat([gru, s[:, :HAND_DIM]], -1)

    @torch.no_grad()
    def widen_range(self, states: torch.Tensor) -> None:
        """Widen the integrator's clamp to cover the hand positions of ``states`` ``[N, S]``."""
        if self.integrator is not None and len(states):
            hand = states[:, :HAND_DIM].to(self.lo)
            self.lo.copy_(torch.minimum(self.lo, hand.amin(0)))
            self.hi.copy_(torch.maximum(self.hi, hand.amax(0)))

    def step(
        self,
        s: torch.Tensor,
        m: torch.Tensor,
        a: torch.Tensor,
        ground: Grounding,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (next state, next memory, progress, success logit)."""
        s2, m2 = self.advance(s, m, a, ground)
        return (s2, m2, *self.outcome_of(s2, ground))

    def advance(
        self, s: torch.Tensor, m: torch.Tensor, a: torch.Tensor, ground: Grounding
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The dynamics of :meth:`step` alone: (next state ``[B, S]``, next memory ``[B, M (+3)]``)."""
        gru, tau = m[:, : self.memory_dim], m[:, self.memory_dim :]  # tau [B, 0] without the integrator
        gru = self.memory(torch.cat([10 * s, a], -1), gru)
        x = [10 * s, a, 10 * (ground.goal - s[:, :GOAL_DIM]), ground.scene, gru]
        if self.integrator is not None:
            tau = tau + self.integrator(a)
            seen = self.lo <= self.hi  # a range widened by data (else unclamped)
            tau = torch.where(seen, torch.maximum(torch.minimum(tau, self.hi), self.lo), tau)
            x.append(10 * (tau - s[:, :HAND_DIM]))
        return s + 0.1 * self.dyn(torch.cat(x, -1)), torch.cat([gru, tau], -1)

    def roll(
        self, s: torch.Tensor, actions: torch.Tensor, ground: Grounding
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Roll the state open-loop from a rollout's first state ``s`` ``[B, S]`` (zero memory) through
        ``actions`` ``[B, T, A]``: (states ``[B, T, S]``, progress ``[B, T]``, success logits
        ``[B, T]``), as :meth:`step` T times (the states exactly; the outcomes to float rounding), with
        the outcome heads applied once to all ``B * T`` states after the roll (one batched call
        instead of T small ones)."""
        b, t = actions.shape[:2]
        mem, rolled = self.initial_memory(s), []
        for k in range(t):
            s, mem = self.advance(s, mem, actions[:, k].float(), ground)
            rolled.append(s)
        states = torch.stack(rolled, 1)  # [B, T, S]
        prog, logit = self.outcome_of(states.flatten(0, 1), ground.per_step(t))
        return states, prog.view(b, t), logit.view(b, t)

    def outcome_of(self, s: torch.Tensor, ground: Grounding) -> tuple[torch.Tensor, torch.Tensor]:
        """(progress ``[B]``, success logit ``[B]``) of a state ``[B, S]``."""
        to_goal = ground.goal - s[:, :GOAL_DIM]
        x = [10 * s, 10 * to_goal, 10 * (ground.goal - ground.tip0), ground.task]
        if self.geometric:
            x += [
                100 * to_goal,
                100 * to_goal.norm(dim=-1, keepdim=True),
                100 * s[:, GOAL_DIM : GOAL_DIM + 1],
            ]
        out = self.outcome(torch.cat(x, -1))
        return torch.sigmoid(out[:, 0]), out[:, 1]
