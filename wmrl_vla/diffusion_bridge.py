"""Post-train lerobot's DiffusionPolicy with GRPO through the log-probability of its denoising chain.

lerobot's DiffusionPolicy (Chi et al. 2023) samples an action chunk ``[H, A]`` by running a DDPM
reverse process: ``K`` U-Net passes from Gaussian noise, conditioned on the observation. Its action
has no tractable density, so :class:`DiffusionChainPolicy` makes every reverse step a Gaussian with
the DDPM posterior mean and a floored spread (:mod:`wmrl_vla.denoising_chain`, DPPO's design)::

    x^0 ~ N(0, I)                                        [H, A]
    x^{k+1} ~ N(m_theta(x^k, t_k, o), s_k^2 I)           k = 0..K-1, t_k the scheduler's timesteps
    action = x^K[0]                                      the chunk's first step (closed loop)
    actions = x^K[:k]                                    or its first k = act_steps, open loop

and records the whole chain with the rollout (``act_with_chain``; ``batch.extras["chains"]``
``[N, T, K+1, H, A]``), so :meth:`log_probs` re-scores the same chain under the current parameters:
the exact log-density GRPO's ratio needs, not a surrogate. ``s_k`` is DDPM's ``fixed_small`` std
floored at ``min_std`` (a noiseless step has no density, and exploration needs noise at the end too).

Tokens: each action dimension of each step is one token (``[N, T*A]``, as the Gaussian bridges), its
log-prob the chain's log-density of that dimension summed over the chunk's ``H`` steps and the ``K``
denoising steps (the tokens of a step sum to the chain's joint log-density); ``batch.tokens`` are
zeros. ``chain_scoring`` picks the terms summed (:func:`~wmrl_vla.denoising_chain.scored_terms`):
the whole chain (``"joint"``, the default), the exact marginal of the executed first action that
integrates out the final step of the chunk's other positions (``"executed_marginal"``), or DPPO's
biased heuristic that scores the executed position alone at every step (``"executed_only"``).
``temperature`` scales the start noise and every step's noise (0: the chain of means from zero
noise, deterministic); the recorded log-prob is always the untempered policy's.

``act_steps`` ``k`` (default 1, closed loop) executes the chunk's first ``k`` positions open loop
before the next chain is sampled (DPPO's ``act_steps``; ``k`` at most the horizon ``H``): one decision
(one chain, one log-prob) per ``k`` environment steps, and the scorings' "executed positions" are
those ``k`` (at ``k = H`` all three scorings are the joint).

``ft_denoising_steps`` ``K'`` (default ``None``: ``K``, the whole chain) fine-tunes only the chain's
last ``K'`` steps (DPPO's ``ft_denoising_steps``): the first ``K - K'`` steps' means come from
``base_model``, a frozen copy of the network taken when the policy is built and again when
:func:`train_bc` has cloned it (:meth:`DiffusionChainPolicy.reset_base`), the last ``K'`` from the
fine-tuned one (``model``), and a decision's log-prob sums only the last ``K'`` steps' terms::

    log p_theta(x^{K-K'+1..K} | x^{K-K'}, o) = sum_{k=K-K'}^{K-1} log N(x^{k+1}; m_theta(x^k, t_k, o), s_k^2 I)

(the chosen ``chain_scoring``'s terms of those rows). Exact for the ratio: the start's and the base's
terms do not depend on the fine-tuned parameters, so they are the same under the old and the new
policy and cancel in ``log p_new - log p_old``.

Two ways in: :meth:`DiffusionChainPolicy.from_config` builds a small policy from lerobot's
``DiffusionConfig`` (random init, no hub; :func:`train_bc` clones it with lerobot's own diffusion
loss), and :meth:`DiffusionChainPolicy.from_folder` loads a ``lerobot-train`` folder with its saved
processors (``domain.policy_path``). WMRL feeds one observation per step, so a folder needs
``n_obs_steps=1``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from wmrl_vla.chain_config import DenoisingChainConfig
from wmrl_vla.denoising_chain import (
    CHAIN_SCORINGS,
    check_ft_steps,
    ddpm_chain_schedule,
    ddpm_step_mean,
    ddpm_step_std,
    sample_chain,
    scored_chain_log_prob,
)
from wmrl_vla.policy import InstructionTokenizer


@dataclass
class DiffusionBridgeConfig:
    """A small lerobot DiffusionPolicy built offline (:meth:`DiffusionChainPolicy.from_config`)."""

    image_size: int = 32
    state_dim: int = 7
    action_dim: int = 4
    # True: one camera image (ResNet-18 with GroupNorm, random init) plus the state; False: the state
    # alone (fed as lerobot's environment state too, its only conditioning besides the robot state).
    use_image: bool = True
    # Action chunk length (a multiple of 2 ** len(down_dims)).
    horizon: int = 4
    # Chunk positions executed open loop per sampled chain (1: closed loop, the first; at most horizon).
    act_steps: int = DenoisingChainConfig.act_steps
    down_dims: list[int] = field(default_factory=lambda: [32, 64])
    diffusion_step_embed_dim: int = 32
    spatial_softmax_num_keypoints: int = 16
    num_train_timesteps: int = 100
    # Denoising steps of the chain (the DDPM scheduler's inference steps).
    chain_steps: int = 10
    # Floor of every step's standard deviation (normalised action units).
    min_std: float = 0.1
    # The chain terms a token's log-prob sums (wmrl_vla.denoising_chain.scored_terms): "joint" (all),
    # "executed_marginal" (exact: the unexecuted positions' final step integrated out) or
    # "executed_only" (DPPO's heuristic: the executed position alone at every step; biased).
    chain_scoring: str = DenoisingChainConfig.scoring
    # Denoising steps fine-tuned (DPPO's ft_denoising_steps K'): the last K' of the chain; the first
    # K - K' run by a frozen copy of the policy as cloned (its base). None: all chain_steps (K' = K).
    ft_denoising_steps: int | None = DenoisingChainConfig.ft_denoising_steps

    def lerobot_config(self):
        from lerobot.configs.types import FeatureType, PolicyFeature
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

        s = self.image_size
        state = PolicyFeature(type=FeatureType.STATE, shape=(self.state_dim,))
        inputs = {"observation.state": state}
        if self.use_image:
            inputs["observation.image"] = PolicyFeature(type=FeatureType.VISUAL, shape=(3, s, s))
        else:
            inputs["observation.environment_state"] = PolicyFeature(
                type=FeatureType.ENV, shape=(self.state_dim,)
            )
        return DiffusionConfig(
            input_features=inputs,
            output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(self.action_dim,))},
            n_obs_steps=1,
            horizon=self.horizon,
            n_action_steps=self.act_steps,
            drop_n_last_frames=0,
            crop_shape=None,
            pretrained_backbone_weights=None,
            use_group_norm=True,
            spatial_softmax_num_keypoints=self.spatial_softmax_num_keypoints,
            down_dims=tuple(self.down_dims),
            diffusion_step_embed_dim=self.diffusion_step_embed_dim,
            num_train_timesteps=self.num_train_timesteps,
            num_inference_steps=self.chain_steps,
            device="cpu",
            push_to_hub=False,
        )


class DiffusionChainPolicy(nn.Module):
    """A lerobot DiffusionPolicy whose sampled chain has an exact log-density. Module docstring.

    Images in are ``[B, 3, H, W]`` uint8, states ``[B, S]``; instructions are ignored (lerobot's
    DiffusionPolicy takes no language), tokenised only to keep the domain's interface."""

    uses_instr = False
    records_chain = True

    def __init__(
        self,
        lerobot_policy,
        chain_steps: int | None = None,
        min_std: float = 0.1,
        processors=None,
        bridge_config: DiffusionBridgeConfig | None = None,
        source_path: str | None = None,
        chain_scoring: str = DiffusionBridgeConfig.chain_scoring,
        act_steps: int = DiffusionBridgeConfig.act_steps,
        ft_denoising_steps: int | None = DiffusionBridgeConfig.ft_denoising_steps,
    ) -> None:
        super().__init__()
        c = lerobot_policy.config
        if c.n_obs_steps != 1:
            raise ValueError(
                f"the diffusion policy conditions on n_obs_steps={c.n_obs_steps} observations; WMRL feeds "
                "one per step (train it with --policy.n_obs_steps=1)"
            )
        if min_std <= 0:
            raise ValueError(f"min_std={min_std} must be > 0 (every denoising step needs a density)")
        if chain_scoring not in CHAIN_SCORINGS:
            raise ValueError(f"chain_scoring={chain_scoring!r} is not one of {', '.join(CHAIN_SCORINGS)}")
        if not 1 <= act_steps <= c.horizon:
            raise ValueError(f"act_steps={act_steps} must be 1..{c.horizon} (the policy's chunk horizon)")
        self.chain_scoring = chain_scoring
        # the chunk positions the environment executes per chain, open loop (1: the first, closed loop)
        self.act_steps = int(act_steps)
        self.lerobot_policy = lerobot_policy.to("cpu")
        self.model = lerobot_policy.diffusion
        self.processors = processors  # (preprocessor, postprocessor) of a lerobot folder, or None
        self.bridge_config = bridge_config
        self.source_path = source_path
        self.min_std = float(min_std)
        steps = chain_steps or self.model.num_inference_steps
        self.schedule = ddpm_chain_schedule(self.model.noise_scheduler, steps)
        stds = [ddpm_step_std(ab, abp, self.min_std) for _, ab, abp in self.schedule]
        self.register_buffer("stds", torch.tensor(stds, dtype=torch.float32), persistent=False)
        self.register_buffer(
            "timesteps", torch.tensor([t for t, _, _ in self.schedule], dtype=torch.long), persistent=False
        )
        ab = torch.tensor([[a, p] for _, a, p in self.schedule], dtype=torch.float64)
        self.register_buffer("alpha_bars", ab.float(), persistent=False)  # [K, 2]: ab_t, ab_prev
        # K': the chain's last K' steps are fine-tuned, the first K - K' run by the frozen base
        self.ft_steps = check_ft_steps(ft_denoising_steps, len(self.schedule))
        self.base_model = None
        if self.ft_steps < len(self.schedule):
            self.base_model = copy.deepcopy(self.model).requires_grad_(False)
        self.tokenizer = InstructionTokenizer()
        self.image_keys = list(c.image_features)
        self.train()

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: DiffusionBridgeConfig) -> DiffusionChainPolicy:
        from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

        return cls(
            DiffusionPolicy(cfg.lerobot_config()), cfg.chain_steps, cfg.min_std, bridge_config=cfg,
            chain_scoring=cfg.chain_scoring, act_steps=cfg.act_steps,
            ft_denoising_steps=cfg.ft_denoising_steps,
        )  # fmt: skip

    @classmethod
    def from_folder(
        cls,
        path: str | Path,
        chain_steps: int | None = None,
        min_std: float = 0.1,
        chain_scoring: str = DiffusionBridgeConfig.chain_scoring,
        act_steps: int = DiffusionBridgeConfig.act_steps,
        ft_denoising_steps: int | None = DiffusionBridgeConfig.ft_denoising_steps,
    ) -> DiffusionChainPolicy:
        """A ``lerobot-train`` diffusion folder with its saved processors (its inputs normalised as in
        training, the action unnormalised after the chain)."""
        from wmrl_vla.lerobot_policy import load_lerobot_folder

        policy, pre, post = load_lerobot_folder(path)
        return cls(
            policy, chain_steps, min_std, processors=(pre, post), source_path=str(path),
            chain_scoring=chain_scoring, act_steps=act_steps, ft_denoising_steps=ft_denoising_steps,
        )  # fmt: skip

    def reset_base(self) -> None:
        """Copy the network as it is now into the frozen base that runs the chain's first ``K - K'``
        steps (a no-op when the whole chain is fine-tuned): the policy GRPO starts from."""
        if self.base_model is not None:
            self.base_model.load_state_dict(self.model.state_dict())

    @property
    def first_ft_step(self) -> int:
        """``K - K'``: the chain step where the fine-tuned network takes over from the frozen base."""
        return len(self.schedule) - self.ft_steps

    def train(self, mode: bool = True) -> DiffusionChainPolicy:
        """The lerobot network stays in eval mode (no random crop, no dropout): a chain's log-prob
        must be a deterministic function of the chain and its observation."""
        super().train(mode)
        self.lerobot_policy.eval()
        if self.base_model is not None:
            self.base_model.eval()
        return self

    @property
    def chunk_shape(self) -> tuple[int, int]:
        c = self.lerobot_policy.config
        return c.horizon, c.action_feature.shape[0]

    # -- the chain ---------------------------------------------------------------------------------
    def condition(self, images: torch.Tensor, states: torch.Tensor, model=None) -> torch.Tensor:
        """``[B, G]`` the U-Net's global conditioning (lerobot's ``_prepare_global_conditioning``) of
        images ``[B, 3, H, W]`` uint8 and states ``[B, S]``, by ``model`` (default: the fine-tuned
        ``self.model``; ``self.base_model`` for the frozen base's steps)."""
        from lerobot.utils.constants import OBS_ENV_STATE, OBS_IMAGES, OBS_STATE

        c = self.lerobot_policy.config
        obs = {OBS_STATE: states.float()}
        if self.image_keys:
            shape = tuple(c.image_features[self.image_keys[0]].shape)
            if images.dim() != 4 or tuple(images.shape[1:]) != shape:
                raise ValueError(f"images have shape {tuple(images.shape)}, the policy takes [B, {shape}]")
            obs[self.image_keys[0]] = images.float() / 255.0
        if c.env_state_feature is not None:
            obs[OBS_ENV_STATE] = states.float()
        if self.processors is not None:
            obs = self.processors[0](obs)
        batch = {OBS_STATE: obs[OBS_STATE].unsqueeze(1)}  # [B, n_obs_steps=1, S]
        if self.image_keys:
            batch[OBS_IMAGES] = torch.stack([obs[k] for k in self.image_keys], 1).unsqueeze(1)
        if c.env_state_feature is not None:
            batch[OBS_ENV_STATE] = obs[OBS_ENV_STATE].unsqueeze(1)
        return (self.model if model is None else model)._prepare_global_conditioning(batch)

    def step_means(self, x: torch.Tensor, k: torch.Tensor, cond: torch.Tensor, model=None) -> torch.Tensor:
        """``[B, H, A]`` DDPM posterior means (:func:`~wmrl_vla.denoising_chain.ddpm_step_mean`) of
        chain states ``x [B, H, A]`` at chain steps ``k [B]`` (long) given ``cond [B, G]``, by
        ``model``'s U-Net (default: the fine-tuned ``self.model``)."""
        c = self.lerobot_policy.config
        out = (self.model if model is None else model).unet(x, self.timesteps[k], global_cond=cond)
        ab = self.alpha_bars[k].view(-1, 2, 1, 1)
        clip = c.clip_sample_range if c.clip_sample else None
        return ddpm_step_mean(x, out, ab[:, 0], ab[:, 1], c.prediction_type, clip)

    def to_actions(self, chunk: torch.Tensor) -> torch.Tensor:
        """The env actions the chain's end ``chunk [B, H, A]`` executes: ``[B, A]`` its first position
        (``act_steps`` 1, closed loop), else ``[B, k, A]`` its first ``k = act_steps`` positions
        ``chunk[:, :k]``, executed open loop; unnormalised by a folder's postprocessor."""
        b, _, a = chunk.shape
        k = self.act_steps
        acts = chunk[:, :k].reshape(b * k, a)
        if self.processors is not None:
            acts = self.processors[1](acts)
        return acts.reshape(b, a) if k == 1 else acts.reshape(b, k, a)

    @torch.no_grad()
    def act_with_chain(
        self,
        images: torch.Tensor,
        states: torch.Tensor,
        instr: torch.Tensor | None = None,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample one decision: (placeholder tokens ``[B, A]`` zeros, log-probs ``[B, A]`` of the chain
        under the untempered policy, scored over the ``act_steps`` executed positions (module
        docstring), actions ``[B, A]`` (``act_steps`` 1) or ``[B, act_steps, A]`` to execute open loop
        (:meth:`to_actions`), chain ``[B, K+1, H, A]``), on the CPU. ``generator`` draws the noise (a
        CPU generator). Steps ``k < K - K'`` are the frozen base's (``ft_denoising_steps``)."""
        if temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0")
        if noise is not None:
            raise ValueError(
                "a diffusion policy draws K x H x A normals per step: common random numbers (noise=) "
                "are not supported; run without twin anchors"
            )
        dev = self.stds.device
        cond = self.condition(images.to(dev), states.to(dev))
        b = cond.shape[0]
        start = temperature * torch.randn(b, *self.chunk_shape, generator=generator)
        ks = torch.arange(len(self.schedule), device=dev)
        first = self.first_ft_step
        base = self.base_model
        base_cond = None if base is None else self.condition(images.to(dev), states.to(dev), base)

        def mean(x: torch.Tensor, k: int) -> torch.Tensor:
            if k < first:  # the frozen base's step
                return self.step_means(x.to(dev), ks[k].expand(b), base_cond, base).cpu()
            return self.step_means(x.to(dev), ks[k].expand(b), cond).cpu()

        chain, means = sample_chain(mean, start, self.stds.cpu(), temperature, generator)
        logp = self.score(chain, means[:, first:], self.stds.cpu())  # [B, A]
        action = self.to_actions(chain[:, -1].to(dev)).cpu()
        return torch.zeros_like(logp, dtype=torch.long), logp, action, chain

    def act(self, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`act_with_chain` without the chain (tokens, log-probs, actions)."""
        return self.act_with_chain(*args, **kwargs)[:3]

    def chain_log_probs(
        self, images: torch.Tensor, states: torch.Tensor, chains: torch.Tensor
    ) -> torch.Tensor:
        """``[B, A]`` log-probs (differentiable) of recorded chains ``[B, K+1, H, A]`` given their
        observations, the fine-tuned ``K'`` steps (all ``K`` by default) in one U-Net pass over
        ``B * K'`` rows."""
        cond = self.condition(images, states)  # [B, G]
        b, k1 = chains.shape[:2]
        k = k1 - 1
        if k != len(self.schedule) or tuple(chains.shape[2:]) != self.chunk_shape:
            raise ValueError(
                f"chains have shape {tuple(chains.shape)}, this policy's are [B, {len(self.schedule) + 1}, "
                f"{self.chunk_shape[0]}, {self.chunk_shape[1]}]"
            )
        first, kf = self.first_ft_step, self.ft_steps
        x = chains[:, first:-1].reshape(b * kf, *self.chunk_shape)
        steps = torch.arange(first, k, device=chains.device).repeat(b)
        means = self.step_means(x, steps, cond.repeat_interleave(kf, 0)).view(b, kf, *self.chunk_shape)
        return self.score(chains, means, self.stds)

    def score(self, chains: torch.Tensor, means: torch.Tensor, stds: torch.Tensor) -> torch.Tensor:
        """``[B, A]`` the chain terms ``chain_scoring`` keeps of the last ``K'`` steps, summed
        (:func:`~wmrl_vla.denoising_chain.scored_chain_log_prob`): ``chains [B, K+1, H, A]``, ``means
        [B, K', H, A]`` of those steps, ``stds [K]``."""
        return scored_chain_log_prob(chains, means, stds, self.chain_scoring, self.act_steps, self.ft_steps)

    def log_probs(self, batch, chunk: int = 256) -> torch.Tensor:
        """``[N, T*A]`` chain log-probs (differentiable) of ``extras["chains"]`` ``[N, T, K+1, H, A]``
        given ``extras["images"]`` and ``extras["states"]``; padded steps 0."""
        return batch_chain_log_probs(self, batch, lambda i, s, _, c: self.chain_log_probs(i, s, c), chunk)

    # -- behaviour cloning -------------------------------------------------------------------------
    def bc_loss(
        self, images: torch.Tensor, states: torch.Tensor, chunks: torch.Tensor, generator=None
    ) -> torch.Tensor:
        """lerobot's own diffusion loss (``DiffusionModel.compute_loss``: noise-prediction MSE at a
        random timestep) of action chunks ``[B, H, A]`` (normalised units) given the observations."""
        cond = self.condition(images, states)
        sched = self.model.noise_scheduler
        eps = torch.randn(chunks.shape, generator=generator)
        t = torch.randint(0, sched.config.num_train_timesteps, (chunks.shape[0],), generator=generator)
        noisy = sched.add_noise(chunks, eps, t)
        pred = self.model.unet(noisy, t, global_cond=cond)
        target = eps if self.lerobot_policy.config.prediction_type == "epsilon" else chunks
        return torch.nn.functional.mse_loss(pred, target)

    # -- checkpoints -------------------------------------------------------------------------------
    def save(self, path) -> None:
        if self.bridge_config is None:
            raise ValueError("a policy loaded from a lerobot folder is saved with save_pretrained")
        torch.save({"config": asdict(self.bridge_config), "state_dict": self.state_dict()}, path)

    @classmethod
    def load(cls, path, **chain) -> DiffusionChainPolicy:
        """The policy :meth:`save` wrote. ``chain``: :class:`DiffusionBridgeConfig` fields of how the
        chain is executed and scored (``act_steps``, ``chain_scoring``, ``ft_denoising_steps``) that
        replace the saved ones: the same network, with the saved frozen base, or a copy of the
        network where none was saved."""
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        model = cls.from_config(replace(DiffusionBridgeConfig(**ckpt["config"]), **chain))
        state = ckpt["state_dict"]
        if model.base_model is None:  # the whole chain fine-tuned: a saved base is not needed
            state = {k: v for k, v in state.items() if not k.startswith("base_model.")}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or any(not k.startswith("base_model.") for k in missing):
            raise ValueError(
                f"{path} does not hold this policy's network: missing {missing}, unexpected {unexpected}"
            )
        if missing:  # saved without a base: the base is the network as saved
            model.reset_base()
        return model


def batch_chain_log_probs(policy, batch, score, chunk: int = 256) -> torch.Tensor:
    """``[N, T*A]`` log-probs of a batch's recorded chains (``extras["chains"]`` ``[N, T, K+1, H, A]``),
    padded steps 0: ``score(images [b, 3, H, W], states [b, S], instr [b, L] or None, chains
    [b, K+1, H, A]) -> [b, A]`` runs on the real steps, ``chunk`` at a time (``instr`` is the
    rollout's instruction ids where ``policy.uses_instr``)."""
    ex = batch.extras
    keys = ("images", "states", "chains", *(("instr",) if policy.uses_instr else ()))
    for key in keys:
        if key not in ex:
            raise KeyError(
                f"batch.extras lacks {key!r}; {type(policy).__name__}.log_probs needs {', '.join(keys)}"
            )
    images, states, chains = ex["images"], ex["states"], ex["chains"]
    n, t = chains.shape[:2]
    a = chains.shape[-1]
    step_mask = batch.mask.reshape(n, t, -1).amax(-1) > 0
    idx = step_mask.reshape(-1).nonzero().squeeze(-1)
    flat_img = images.reshape(n * t, *images.shape[2:])
    flat_state = states.reshape(n * t, -1)
    flat_instr = ex["instr"].repeat_interleave(t, 0) if policy.uses_instr else None
    flat_chain = chains.reshape(n * t, *chains.shape[2:])
    pieces = [
        score(flat_img[j], flat_state[j], None if flat_instr is None else flat_instr[j], flat_chain[j])
        for j in idx.split(chunk)
    ]
    out = torch.zeros(n * t, a, device=chains.device)
    if pieces:
        out = out.index_put((idx,), torch.cat(pieces))
    return out.reshape(n, t * a)


def action_chunks(actions: np.ndarray, horizon: int) -> np.ndarray:
    """``[T, H, A]`` the chunk of ``horizon`` actions from each step of one episode's ``[T, A]``
    actions, past the end padded with the last action (lerobot's edge padding)."""
    t = len(actions)
    idx = np.minimum(np.arange(t)[:, None] + np.arange(horizon)[None], t - 1)
    return actions[idx]


def train_bc(
    policy: DiffusionChainPolicy,
    records: Sequence[dict],
    steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
) -> list[float]:
    """Behaviour cloning of a :meth:`~DiffusionChainPolicy.from_config` policy with its diffusion loss
    (:meth:`~DiffusionChainPolicy.bc_loss`) on demo records (actions in [-1, 1], used unnormalised).
    Returns the loss of every 10th step. The cloned network is also the frozen base of a policy that
    fine-tunes only its last denoising steps (:meth:`~DiffusionChainPolicy.reset_base`)."""
    from world_models.vla_dynamics import episodes_from_records

    if policy.processors is not None:
        raise ValueError(
            "train_bc clones a policy built from a config; a lerobot folder is trained by lerobot"
        )
    eps = episodes_from_records(records)
    horizon = policy.chunk_shape[0]
    imgs = torch.from_numpy(np.concatenate([e["images"][: len(e["actions"])] for e in eps]))
    sts = torch.from_numpy(np.concatenate([e["states"][: len(e["actions"])] for e in eps])).float()
    chunks = torch.from_numpy(np.concatenate([action_chunks(e["actions"], horizon) for e in eps])).float()
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr, weight_decay=1e-6)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    hist = []
    for step in range(steps):
        j = torch.randint(0, len(chunks), (batch_size,), generator=g)
        loss = policy.bc_loss(imgs[j], sts[j], chunks[j], generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 10 == 0:
            hist.append(float(loss.detach()))
    policy.reset_base()  # the frozen base of ft_denoising_steps is the policy as cloned
    return hist
