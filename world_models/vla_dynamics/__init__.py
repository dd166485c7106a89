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
random on long episodes. ``state_integrator=True`` adds to each grounded member a learned
integrator of the actions (the hand's position target, clamped to the hand positions of the
training data), so that the rolled hand need not drift. ``outcome_reads="geometry"`` gives the outcome
heads the hand's offset to the goal and its height in centimetres and the task from the instruction's
words in place of the scene's embedding, which can tell the training episodes apart.

The ensemble's spread of the rollout score is its own uncertainty (``Prediction.var``).

Episodes (what :func:`episodes_from_records` makes from LeRobot records): dicts of numpy arrays
``images`` ``[T+1, 3, H, W]`` uint8 (the frame before each action, plus the last frame if known,
else ``T`` frames), ``states`` ``[T(+1), S]``, ``actions`` ``[T, A]``, ``progress`` ``[T]`` (after each
action), ``success`` ``[T]`` (after each action).

Modules: ``config`` (:class:`VLADynamicsConfig`), ``networks`` (encoder, decoder, members), ``model``
(:class:`VLADynamics`), ``data`` (episodes and windows), ``train`` (:func:`train_dynamics`),
``scoring`` (rollout score, variance calibration), ``evaluate`` (quality on held-out episodes).
Their public names are importable from this package.
"""

from world_models.vla_dynamics.config import (
    FRAME_DECODERS,
    GOAL_DIM,
    OUTCOME_INPUTS,
    OUTCOME_READS,
    VLADynamicsConfig,
)
from world_models.vla_dynamics.data import (
    MAX_INSTRUCTION_WORDS,
    episode_goals,
    episodes_from_records,
    instruction_ids,
    sample_windows,
)
from world_models.vla_dynamics.evaluate import evaluate_dynamics, score_episodes, success_auc
from world_models.vla_dynamics.model import VLADynamics
from world_models.vla_dynamics.networks import FrameDecoder, FrameEncoder, GroundedMember, Grounding, Member
from world_models.vla_dynamics.scoring import (
    calibration_stats,
    expected_rollout_reward,
    fit_variance_calibration,
    rollout_score,
)
from world_models.vla_dynamics.train import train_dynamics

__all__ = [
    "FRAME_DECODERS",
    "GOAL_DIM",
    "MAX_INSTRUCTION_WORDS",
    "OUTCOME_INPUTS",
    "OUTCOME_READS",
    "FrameDecoder",
    "FrameEncoder",
    "GroundedMember",
    "Grounding",
    "Member",
    "VLADynamics",
    "VLADynamicsConfig",
    "calibration_stats",
    "episode_goals",
    "episodes_from_records",
    "evaluate_dynamics",
    "expected_rollout_reward",
    "fit_variance_calibration",
    "instruction_ids",
    "rollout_score",
    "sample_windows",
    "score_episodes",
    "success_auc",
    "train_dynamics",
]
