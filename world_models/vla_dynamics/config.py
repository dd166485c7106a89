"""The world model's configuration (:class:`VLADynamicsConfig`) and its named choices."""

from __future__ import annotations

from dataclasses import dataclass

FRAME_DECODERS = ("deterministic", "diffusion")
OUTCOME_INPUTS = ("latent", "state")
OUTCOME_READS = ("scene", "geometry")
GOAL_DIM = 2  # the named object's table xy (metres), as the simulator places it at reset
HAND_DIM = 3  # the hand's xyz: the state's first entries, the frame of the grounded integrator


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
    # With outcome_input="state": the grounded members also carry a learned integrator of the actions
    # (the hand's position target, clamped to the hand positions the training data saw), which the
    # rolled state follows: :class:`GroundedMember`.
    state_integrator: bool = False
    # With outcome_input="state", what the grounded outcome heads read besides the state and the goal
    # offset in decimetres: "scene" (the task embedding of the first observation's latent, which can
    # tell the training episodes apart and so learn their outcomes by heart) or "geometry" (the hand's
    # offset to the goal and its height in centimetres, and the task from the instruction's hashed
    # words, which name a task and an object, never an episode; needs instruction_buckets > 0).
    outcome_reads: str = "scene"
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
        if self.outcome_reads not in OUTCOME_READS:
            raise ValueError(f"outcome_reads={self.outcome_reads!r} is not one of {', '.join(OUTCOME_READS)}")
        if self.outcome_reads == "geometry" and not (
            self.outcome_input == "state" and self.instruction_buckets
        ):
            raise ValueError(
                "outcome_reads='geometry' needs outcome_input='state' (grounded heads) and "
                f"instruction_buckets > 0 (got {self.outcome_input!r}, {self.instruction_buckets})"
            )
        if self.instruction_buckets < 0:
            raise ValueError(f"instruction_buckets={self.instruction_buckets} must be >= 0")
