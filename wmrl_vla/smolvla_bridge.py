"""Post-train lerobot's SmolVLA with GRPO: its flow-matching action becomes the mean of a Gaussian.

SmolVLA (lerobot 0.6.1, ``lerobot.policies.smolvla``) is a vision-language-action model: a SmolVLM
(image + instruction + state prefix) and a smaller "action expert" that turns noise into an action
chunk by flow matching. It is built here with no hub access and no pretrained weights:

* **A local SmolVLM directory.** SmolVLA calls ``AutoConfig/AutoProcessor.from_pretrained(
  vlm_model_name)`` even with ``load_vlm_weights=False``. :func:`write_local_smolvlm` writes, under
  the domain's cache dir, a tiny ``SmolVLMConfig`` (Llama text tower and SigLIP-style vision tower
  from transformers' config classes, sized to run on a CPU), a BPE tokenizer trained with the
  ``tokenizers`` library on the task instructions plus the special tokens SmolVLM's processor and
  SmolVLA read (``<fake_token_around_image>``, ``<global-img>``, ``<image>``, ``<end_of_utterance>``),
  and the ``SmolVLMProcessor`` saved with ``save_pretrained``; ``vlm_model_name`` points there.
  The VLM is random: ``load_vlm_weights=False``, and it is trained (``train_expert_only=False``,
  ``freeze_vision_encoder=False``), since a frozen random VLM would be a fixed random feature map;
  lerobot still freezes the last text layer, the final norm and ``lm_head`` in that mode. With the
  defaults (64x64 frames, text width 64, 2 layers) SmolVLA has about 221k parameters, 173k trainable.
* **Language goes in for real.** Instructions are tokenised with that tokenizer (right-padded to
  ``max_instr_tokens``, as lerobot's ``TokenizerProcessorStep`` does) and fed to SmolVLA with their
  attention mask; ``policy.tokenizer.encode`` returns those ids, so ``batch.extras["instr"]`` carries
  them and :meth:`SmolVLAGaussianPolicy.log_probs` re-reads them.
* **Closed loop.** ``chunk_size = n_action_steps = 1``: one action per observation, as the
  clipped-ratio loss assumes. Images are fed at their own size (``resize_imgs_with_padding`` equals
  the frame size, the vision tower's ``image_size`` too), states and actions at the env's dims
  (``max_state_dim``/``max_action_dim``: no padding).

The Gaussian head (same design as :mod:`wmrl_vla.lerobot_bridge`)::

    mu(o, l) = SmolVLA flow-matching sample from zero noise (num_steps Euler steps)
    a ~ N(mu(o, l), diag(exp(log_std))^2),   log_std learnable, state-independent

**Why zero noise.** SmolVLA's own sampler draws the initial noise at random, so its action is itself
stochastic with an intractable density. Integrating its velocity field from the *fixed* noise 0 (the
noise distribution's mode) makes the mean a deterministic, differentiable function of the
observation and instruction (``VLAFlowMatching.sample_actions`` with ``noise=0``; nothing in it runs
under ``no_grad``). The exploration noise is all in the Gaussian, whose log-density GRPO needs.

**How the mean is trained.** SFT (:func:`wmrl_vla.lerobot_bridge.sft_gaussian`) minimises, per minibatch,
``Gaussian NLL(mu, log_std) + fm_weight * SmolVLA's flow-matching loss``. The NLL's gradient reaches
the mean by back-propagating through the unrolled Euler steps (cheap at this size, and it trains
exactly the function that is used as the mean); the flow-matching loss is SmolVLA's own objective
and keeps the velocity field a proper flow toward the demos, so SmolVLA's native stochastic
``select_action`` stays meaningful too. For GRPO, ``log_probs`` is differentiable in ``log_std`` and,
through the unrolled sampler, in every trainable SmolVLA parameter: the policy gradient moves the
mean network, not only the spread. On the CPU this costs ``num_steps`` expert passes plus one VLM
pass per step of each rollout; ``num_steps`` is kept small (4) for that reason.

As in the ACT bridge: each action dimension of each step is one "token" whose log-prob is the
Gaussian log-density of the sampled value (tokens ``[N, T*A]``; ``batch.tokens`` are zeros), the
sampled continuous actions travel in ``batch.extras["actions"]`` ``[N, T, A]``, and the log-density is
of the unclipped sample. States and actions enter SmolVLA unnormalised (the env's actions already
lie in [-1, 1]; lerobot's normalisation lives in its processor pipeline, which is not used here).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from wmrl_vla.denoising_chain import chain_log_prob, euler_step_mean, euler_step_std, sample_chain
from wmrl_vla.lerobot_bridge import GaussianActionHead

# Special tokens SmolVLM's tokenizer carries that SmolVLMProcessor and SmolVLA read by attribute.
SMOLVLM_TOKENS = {
    "fake_image_token": "<fake_token_around_image>",
    "image_token": "<image>",
    "global_image_token": "<global-img>",
    "end_of_utterance_token": "<end_of_utterance>",
}
PAD, UNK, BOS = "<pad>", "<unk>", "<|im_start|>"
# Tile-position tokens of SmolVLM's image splitting (unused here: images are never split).
ROW_COL_TOKENS = [f"<row_{r}_col_{c}>" for r in range(1, 3) for c in range(1, 3)]


def default_instruction_corpus() -> list[str]:
    """Every instruction the project's own tabletop tasks can produce (templates x colours)."""
    from sims.own.base import COLOURS
    from sims.own.button import PressButtonEnv
    from sims.own.lift import LiftColorEnv
    from sims.own.push import PushColorEnv
    from sims.own.reach import ReachColorEnv

    envs = (ReachColorEnv, PushColorEnv, PressButtonEnv, LiftColorEnv)
    return sorted(
        {t.format(c=c, z=z) for env in envs for t in env.templates for c in COLOURS for z in COLOURS}
    )


def train_instruction_tokenizer(corpus: Sequence[str], vocab_size: int = 256) -> str:
    """A lower-casing BPE tokenizer (JSON) trained on ``corpus`` with SmolVLM's special tokens.

    The initial alphabet holds every printable ASCII character, so an instruction outside the corpus
    still tokenises (into smaller pieces) instead of falling back to ``<unk>``."""
    import string

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    if not corpus:
        raise ValueError("the tokenizer's training corpus is empty")
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    special = [PAD, UNK, BOS, *SMOLVLM_TOKENS.values(), "<video>", *ROW_COL_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=list(string.ascii_lowercase + string.digits + string.punctuation),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    return tok.to_str()


@dataclass
class SmolVLABridgeConfig:
    image_size: int = 64
    state_dim: int = 7
    action_dim: int = 4
    # Tiny SmolVLM text tower (Llama): hidden size, layers, heads, key/value heads.
    text_hidden: int = 64
    text_layers: int = 2
    text_heads: int = 4
    text_kv_heads: int = 2
    # Tiny vision tower: hidden size, layers, heads, patch side (image_size / patch_size must be a
    # multiple of the connector's pixel-shuffle factor 2).
    vision_hidden: int = 32
    vision_layers: int = 1
    vision_heads: int = 2
    patch_size: int = 8
    # Action expert width relative to the text tower (SmolVLA's expert_width_multiplier).
    expert_width_multiplier: float = 0.75
    # Euler steps of the flow-matching sampler that computes the mean.
    num_steps: int = 4
    # Instruction tokens fed to SmolVLA (right-padded, truncated past this).
    max_instr_tokens: int = 16
    # Instructions the BPE tokenizer is trained on (empty: the project's tabletop instructions).
    corpus: list[str] = field(default_factory=list)
    tokenizer_vocab: int = 256
    # Where the local SmolVLM config/tokenizer/processor directories are written.
    vlm_cache_dir: str = "runs/cache/vla/smolvlm"
    # Weight of SmolVLA's flow-matching loss next to the Gaussian NLL in SFT.
    fm_weight: float = 1.0
    init_log_std: float = -1.0
    min_log_std: float = -4.0
    max_log_std: float = 1.0
    # Noise level sigma of the stochastic Euler steps of SmolVLAFlowChainPolicy (each step's std is
    # sigma * sqrt(1 / num_steps)).
    flow_sigma: float = 0.5

    def __post_init__(self) -> None:
        if self.flow_sigma <= 0:
            raise ValueError(f"flow_sigma={self.flow_sigma} must be > 0 (each Euler step needs a density)")
        if self.image_size % (2 * self.patch_size) != 0:
            raise ValueError(
                f"image_size={self.image_size} must be a multiple of 2 * patch_size={2 * self.patch_size}"
            )
        if self.num_steps < 1 or self.max_instr_tokens < 1:
            raise ValueError(
                f"num_steps={self.num_steps} and max_instr_tokens={self.max_instr_tokens} must be >= 1"
            )


def write_local_smolvlm(cfg: SmolVLABridgeConfig, tokenizer_json: str) -> Path:
    """Write (once) a SmolVLM directory that ``from_pretrained`` loads offline; returns its path.

    The directory name hashes everything written into it, so different sizes or tokenizers never
    share one, and a complete directory (marked by ``wmrl_done``) is reused."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast, SmolVLMConfig, SmolVLMProcessor
    from transformers.models.smolvlm.image_processing_smolvlm import SmolVLMImageProcessor
    from transformers.models.smolvlm.video_processing_smolvlm import SmolVLMVideoProcessor

    vocab = Tokenizer.from_str(tokenizer_json).get_vocab_size()
    pad_id = Tokenizer.from_str(tokenizer_json).token_to_id(PAD)
    s, p = cfg.image_size, cfg.patch_size
    image_seq_len = (s // p) ** 2 // 4  # pixel shuffle by 2 in each direction
    vlm_config = {
        "text_config": {
            "model_type": "llama",
            "vocab_size": vocab,
            "hidden_size": cfg.text_hidden,
            "intermediate_size": 2 * cfg.text_hidden,
            "num_hidden_layers": cfg.text_layers,
            "num_attention_heads": cfg.text_heads,
            "num_key_value_heads": cfg.text_kv_heads,
            "max_position_embeddings": 512,
            "pad_token_id": pad_id,
            "rms_norm_eps": 1e-5,
        },
        "vision_config": {
            "hidden_size": cfg.vision_hidden,
            "intermediate_size": 2 * cfg.vision_hidden,
            "num_hidden_layers": cfg.vision_layers,
            "num_attention_heads": cfg.vision_heads,
            "image_size": s,
            "patch_size": p,
        },
        "scale_factor": 2,
        "image_token_id": Tokenizer.from_str(tokenizer_json).token_to_id(SMOLVLM_TOKENS["image_token"]),
        "pad_token_id": pad_id,
    }
    key = hashlib.sha1(json.dumps([vlm_config, tokenizer_json, cfg.max_instr_tokens]).encode()).hexdigest()[
        :10
    ]
    root = Path(cfg.vlm_cache_dir) / f"smolvlm-{key}"
    if (root / "wmrl_done").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    SmolVLMConfig(**vlm_config).save_pretrained(root)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tokenizer_json),
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=SMOLVLM_TOKENS["end_of_utterance_token"],
        extra_special_tokens=dict(SMOLVLM_TOKENS),
        model_max_length=cfg.max_instr_tokens,
        padding_side="right",
    )
    size = {"longest_edge": s}
    processor = SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(size=size, max_image_size=size, do_image_splitting=False),
        tokenizer=tokenizer,
        video_processor=SmolVLMVideoProcessor(size=size, max_image_size=size),
        image_seq_len=image_seq_len,
    )
    processor.save_pretrained(root)
    (root / "wmrl_done").write_text("ok")
    return root


class SmolVLMInstructionTokenizer:
    """The local SmolVLM tokenizer behind the domain's ``tokenizer.encode(texts) -> [B, L]`` interface."""

    def __init__(self, vlm_dir: Path, max_len: int) -> None:
        from transformers import AutoTokenizer

        self.hf = AutoTokenizer.from_pretrained(str(vlm_dir))
        self.max_len = max_len
        self.pad_id = int(self.hf.pad_token_id)

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """``[B, max_len]`` token ids, right-padded with ``pad_id`` (truncated past ``max_len``)."""
        if isinstance(texts, str):
            raise TypeError("encode() takes a sequence of instructions, not one string")
        enc = self.hf(
            list(texts), padding="max_length", truncation=True, max_length=self.max_len, return_tensors="pt"
        )
        return enc["input_ids"].long()


class SmolVLAGaussianPolicy(GaussianActionHead):
    """lerobot SmolVLA (offline, random init) as the mean of a diagonal Gaussian. See the module docstring.

    ``act`` and ``log_probs`` come from :class:`~wmrl_vla.lerobot_bridge.GaussianActionHead`; the
    instruction ids (``batch.extras["instr"]``) are part of every step's input."""

    uses_instr = True

    def __init__(self, cfg: SmolVLABridgeConfig, tokenizer_json: str | None = None) -> None:
        super().__init__()
        from lerobot.configs.types import FeatureType, PolicyFeature
        from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
        from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

        self.cfg = cfg
        if tokenizer_json is None:
            corpus = cfg.corpus or default_instruction_corpus()
            tokenizer_json = train_instruction_tokenizer(corpus, cfg.tokenizer_vocab)
        self.tokenizer_json = tokenizer_json
        self.vlm_dir = write_local_smolvlm(cfg, tokenizer_json)
        self.tokenizer = SmolVLMInstructionTokenizer(self.vlm_dir, cfg.max_instr_tokens)
        s = cfg.image_size
        self.smolvla_config = SmolVLAConfig(
            input_features={
                "observation.image": PolicyFeature(type=FeatureType.VISUAL, shape=(3, s, s)),
                "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(cfg.state_dim,)),
            },
            output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(cfg.action_dim,))},
            chunk_size=1,
            n_action_steps=1,
            max_state_dim=cfg.state_dim,
            max_action_dim=cfg.action_dim,
            resize_imgs_with_padding=(s, s),
            tokenizer_max_length=cfg.max_instr_tokens,
            num_steps=cfg.num_steps,
            vlm_model_name=str(self.vlm_dir),
            load_vlm_weights=False,
            train_expert_only=False,
            freeze_vision_encoder=False,
            num_vlm_layers=cfg.text_layers,
            expert_width_multiplier=cfg.expert_width_multiplier,
            device="cpu",
            push_to_hub=False,
        )
        self.lerobot_policy = SmolVLAPolicy(self.smolvla_config)
        self.log_std = nn.Parameter(torch.full((cfg.action_dim,), float(cfg.init_log_std)))
        self.train()

    def _inputs(self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor):
        """SmolVLA's (images, image masks, language tokens, language masks, state) for a batch."""
        s = self.cfg.image_size
        if images.dim() != 4 or images.shape[1:] != (3, s, s):
            raise ValueError(f"images have shape {tuple(images.shape)}, expected [B, 3, {s}, {s}]")
        if instr.dim() != 2 or instr.shape[0] != images.shape[0]:
            raise ValueError(f"instr has shape {tuple(instr.shape)}, expected [{images.shape[0]}, L]")
        pol = self.lerobot_policy
        batch = {"observation.image": images.float() / 255.0, "observation.state": states.float()}
        imgs, img_masks = pol.prepare_images(batch)
        return imgs, img_masks, instr, instr != self.tokenizer.pad_id, pol.prepare_state(batch)

    def mean(self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor) -> torch.Tensor:
        """``[B, A]`` Gaussian means: SmolVLA's flow-matching sample from zero noise (differentiable).

        images ``[B, 3, H, W]`` uint8, states ``[B, S]``, instr ``[B, L]`` ids from ``self.tokenizer``."""
        imgs, img_masks, lang, lang_masks, state = self._inputs(images, states, instr)
        noise = torch.zeros(images.shape[0], 1, self.cfg.action_dim)
        actions = self.lerobot_policy.model.sample_actions(
            imgs, img_masks, lang, lang_masks, state, noise=noise
        )
        return actions[:, 0, : self.cfg.action_dim]

    def flow_matching_loss(
        self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor, actions: torch.Tensor
    ) -> torch.Tensor:
        """SmolVLA's own training loss (``VLAFlowMatching.forward``, mean over the batch)."""
        imgs, img_masks, lang, lang_masks, state = self._inputs(images, states, instr)
        losses = self.lerobot_policy.model(imgs, img_masks, lang, lang_masks, state, actions[:, None].float())
        return losses.mean()

    def sft_aux_loss(
        self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor | None, actions: torch.Tensor
    ) -> torch.Tensor | float:
        """``fm_weight`` x SmolVLA's flow-matching loss, added to the Gaussian NLL in SFT."""
        if self.cfg.fm_weight <= 0:
            return 0.0
        return self.cfg.fm_weight * self.flow_matching_loss(images, states, self.step_instr(instr), actions)

    @staticmethod
    def step_instr(instr: torch.Tensor | None) -> torch.Tensor:
        if instr is None:
            raise ValueError("SmolVLA needs the instruction ids (policy.tokenizer.encode)")
        return instr

    def step_mean(
        self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor | None
    ) -> torch.Tensor:
        return self.mean(images, states, self.step_instr(instr))

    def save(self, path) -> None:
        torch.save(
            {"config": asdict(self.cfg), "tokenizer": self.tokenizer_json, "state_dict": self.state_dict()},
            path,
        )

    @classmethod
    def load(cls, path, vlm_cache_dir: str | None = None) -> SmolVLAGaussianPolicy:
        """Rebuild from a checkpoint; the local SmolVLM directory is rewritten if missing (optionally
        under ``vlm_cache_dir`` instead of the saved one)."""
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        c = dict(ckpt["config"])
        if vlm_cache_dir is not None:
            c["vlm_cache_dir"] = vlm_cache_dir
        model = cls(SmolVLABridgeConfig(**c), tokenizer_json=ckpt["tokenizer"])
        model.load_state_dict(ckpt["state_dict"])
        return model


class SmolVLAFlowChainPolicy(SmolVLAGaussianPolicy):
    """SmolVLA whose action is the end of a stochastic flow-matching chain with an exact log-density
    (:mod:`wmrl_vla.denoising_chain`; ReinFlow / piRL's noise-injected Euler steps)::

        x^0 ~ N(0, I)                                           [1, A]
        x^{k+1} ~ N(x^k + v_theta(x^k, t_k, o, l) dt, (sigma sqrt(|dt|))^2 I)
        t_k = 1 + k dt,  dt = -1 / num_steps                   (SmolVLA's own Euler schedule)
        action = x^K

    ``v_theta`` is SmolVLA's own velocity (``VLAFlowMatching.denoise_step`` over the image + language
    + state prefix's key/value cache, computed once per observation). ``act_with_chain`` records the
    chain ``[B, K+1, 1, A]`` with the rollout and :meth:`log_probs` re-scores it under the current
    parameters (``batch.extras["chains"]``). At temperature 0 the chain starts from zero noise and
    adds none: the Gaussian bridge's mean. SFT is the Gaussian bridge's (the mean and SmolVLA's
    flow-matching loss); the Gaussian's ``log_std`` is unused here."""

    records_chain = True

    def velocity(self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor):
        """``v(x [B, 1, A], t) -> [B, 1, A]``: SmolVLA's velocity field at flow time ``t`` for this batch
        of observations (the prefix's key/value cache computed once, here)."""
        from lerobot.policies.smolvla.modeling_smolvla import make_att_2d_masks

        imgs, img_masks, lang, lang_masks, state = self._inputs(images, states, instr)
        m = self.lerobot_policy.model
        embs, pad_masks, att_masks = m.embed_prefix(imgs, img_masks, lang, lang_masks, state=state)
        _, cache = m.vlm_with_expert.forward(
            attention_mask=make_att_2d_masks(pad_masks, att_masks),
            position_ids=torch.cumsum(pad_masks, dim=1) - 1,
            past_key_values=None,
            inputs_embeds=[embs, None],
            use_cache=m.config.use_cache,
        )
        b = images.shape[0]

        def v(x: torch.Tensor, t: float) -> torch.Tensor:
            return m.denoise_step(pad_masks, cache, x, torch.full((b,), float(t)))

        return v

    @property
    def chain_stds(self) -> torch.Tensor:
        """``[K]`` every Euler step's std ``sigma sqrt(1 / num_steps)``."""
        k = self.cfg.num_steps
        return torch.full((k,), euler_step_std(self.cfg.flow_sigma, 1.0 / k))

    def _chain_means(self, v, x: torch.Tensor, k: int) -> torch.Tensor:
        dt = -1.0 / self.cfg.num_steps
        return euler_step_mean(x, v(x, 1.0 + k * dt), dt)

    @torch.no_grad()
    def act_with_chain(
        self,
        images: torch.Tensor,
        states: torch.Tensor,
        instr: torch.Tensor,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(placeholder tokens ``[B, A]`` zeros, the chain's log-probs ``[B, A]`` under the untempered
        policy, actions ``[B, A]``, chains ``[B, K+1, 1, A]``); ``temperature`` scales the start noise
        and each step's noise."""
        if temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0")
        if noise is not None:
            raise ValueError(
                "a flow chain draws (K+1) x A normals per step: common random numbers are not supported"
            )
        v = self.velocity(images, states, self.step_instr(instr))
        start = temperature * torch.randn(images.shape[0], 1, self.cfg.action_dim, generator=generator)
        stds = self.chain_stds
        chain, means = sample_chain(
            lambda x, k: self._chain_means(v, x, k), start, stds, temperature, generator
        )
        logp = chain_log_prob(chain, means, stds).sum(1)  # [B, A]
        return torch.zeros_like(logp, dtype=torch.long), logp, chain[:, -1, 0], chain

    def act(self, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`act_with_chain` without the chain (tokens, log-probs, actions)."""
        return self.act_with_chain(*args, **kwargs)[:3]

    def chain_log_probs(
        self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor, chains: torch.Tensor
    ) -> torch.Tensor:
        """``[B, A]`` log-probs (differentiable) of recorded chains ``[B, K+1, 1, A]``."""
        k = self.cfg.num_steps
        if chains.shape[1:] != (k + 1, 1, self.cfg.action_dim):
            raise ValueError(
                f"chains have shape {tuple(chains.shape)}, expected [B, {k + 1}, 1, {self.cfg.action_dim}]"
            )
        v = self.velocity(images, states, instr)
        means = torch.stack([self._chain_means(v, chains[:, j], j) for j in range(k)], 1)
        return chain_log_prob(chains, means, self.chain_stds).sum(1)

    def log_probs(self, batch, chunk: int = 256) -> torch.Tensor:
        """``[N, T*A]`` log-probs (differentiable) of ``extras["chains"]`` given the rollouts' images,
        states and instruction ids; padded steps 0."""
        from wmrl_vla.diffusion_bridge import batch_chain_log_probs

        return batch_chain_log_probs(self, batch, self.chain_log_probs, chunk)
