"""A small vision-language-action policy trained from scratch, with discretised action tokens.

Inputs per time step: an RGB frame ``[3, H, W]`` (uint8), proprioception ``[S]`` and an instruction
(word ids from :class:`InstructionTokenizer`). A small CNN turns the frame into ``(H/16) * (W/16)``
patch tokens (plus a keypoint token), each instruction word is one token, proprioception is one token, and ``A`` learned
query tokens (one per action dimension) read them through a small transformer encoder. Each query
emits logits over ``n_bins`` bins of its action dimension in ``[-1, 1]``. The CNN is conditioned on
the instruction (FiLM) and adds one spatial-softmax keypoint token (see :class:`wmrl_vla.vision.FiLMEncoder`).

The action dimensions are independent given the observation, so the log-prob of a step is the sum
of ``A`` exact categorical log-probs and the core's token-level clipped-ratio loss applies with one
token per (step, action dimension): a rollout of ``T`` steps has ``T * A`` tokens, step-major.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from wmrl_vla.vision import LOC_UNIT, OFFSET_SCALE, FiLMEncoder, TargetLocator

PAD_ID = 0


class InstructionTokenizer:
    """Word-level tokenizer with a hashed vocabulary: no hub, no fitted vocabulary file.

    Lower-cased words (``[a-z0-9]+``) map to ``1 + crc32(word) % (vocab_size - 1)``; id 0 is padding.
    Instructions come from a handful of templates over colour and object words, so with a few hundred
    buckets collisions are rare, and a word never seen in training still gets a stable id.
    """

    def __init__(self, vocab_size: int = 512, max_len: int = 16) -> None:
        if vocab_size < 2 or max_len < 1:
            raise ValueError(f"vocab_size={vocab_size} must be >= 2 and max_len={max_len} >= 1")
        self.vocab_size = vocab_size
        self.max_len = max_len

    def words(self, text: str) -> list[str]:
        return re.findall(r"[a-z0-9]+", text.lower())

    def word_id(self, word: str) -> int:
        return 1 + zlib.crc32(word.encode()) % (self.vocab_size - 1)

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """``[B, max_len]`` long word ids, right-padded with 0 (truncated past ``max_len``)."""
        if isinstance(texts, str):
            raise TypeError("encode() takes a sequence of instructions, not one string")
        out = torch.zeros(len(texts), self.max_len, dtype=torch.long)
        for i, t in enumerate(texts):
            ids = [self.word_id(w) for w in self.words(t)][: self.max_len]
            if not ids:
                raise ValueError(f"instruction {t!r} has no words")
            out[i, : len(ids)] = torch.tensor(ids)
        return out


@dataclass
class SmallVLAConfig:
    image_size: int = 64
    state_dim: int = 8
    action_dim: int = 4
    # Bins per action dimension, evenly spaced over [-1, 1] (odd keeps 0 exactly representable).
    n_bins: int = 21
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    vocab_size: int = 512
    max_words: int = 16
    dropout: float = 0.0
    # Full-resolution target locator (see :class:`TargetLocator`): its estimate of the named
    # object's table xy, and that minus the hand's xy (the first two proprioception dims in every
    # sims task), join the proprioception token's input.
    locator: bool = True
    locator_channels: int = 16

    def __post_init__(self) -> None:
        if self.image_size % 16 != 0:
            raise ValueError(f"image_size={self.image_size} must be a multiple of 16")
        if self.n_bins < 2:
            raise ValueError(f"n_bins={self.n_bins} must be >= 2")
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")


def bin_centers(n_bins: int) -> torch.Tensor:
    """``[n_bins]`` bin centres in [-1, 1], endpoints included."""
    return bins_to_actions(torch.arange(n_bins), n_bins)


def actions_to_bins(actions: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Continuous actions (any shape, values clipped to [-1, 1]) -> nearest bin index (long)."""
    a = actions.clamp(-1.0, 1.0)
    return torch.round((a + 1.0) * 0.5 * (n_bins - 1)).long()


def bins_to_actions(bins: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Bin indices -> their centres in [-1, 1] (float)."""
    return bins.float() * (2.0 / (n_bins - 1)) - 1.0


def pack_visual(patches: torch.Tensor, keypoint: torch.Tensor, loc_xy: torch.Tensor | None) -> torch.Tensor:
    """``patches`` ``[B, P, d]``, ``keypoint`` ``[B, 1, d]``, ``loc_xy`` ``[B, 2]`` or None ->
    ``[B, (P+1)*d (+2)]``: the tokens flattened token-major, then the locator's xy."""
    flat = torch.cat([patches, keypoint], 1).flatten(1)
    return flat if loc_xy is None else torch.cat([flat, loc_xy], 1)


def unpack_visual(
    features: torch.Tensor, n_patches: int, d: int, locator: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Inverse of :func:`pack_visual`: ``[B, F]`` -> (patches ``[B, P, d]``, keypoint ``[B, 1, d]``,
    locator xy ``[B, 2]`` or None)."""
    n_tok = (n_patches + 1) * d
    if features.shape[1] != n_tok + (2 if locator else 0):
        raise ValueError(
            f"features have {features.shape[1]} columns, expected {n_tok + (2 if locator else 0)}"
        )
    tokens = features[:, :n_tok].reshape(features.shape[0], n_patches + 1, d)
    return tokens[:, :n_patches], tokens[:, n_patches:], features[:, n_tok:] if locator else None


class SmallVLA(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="wmrl",
    tags=["wmrl", "robotics", "vision-language-action"],
):
    """Image + instruction + proprioception -> per-dimension action-bin logits.

    ``save_pretrained(DIR)`` / ``SmallVLA.from_pretrained(DIR or hub repo)`` (huggingface_hub's
    ``PyTorchModelHubMixin``) write and read ``model.safetensors`` + ``config.json`` (``{"cfg": ...}``).
    """

    def __init__(self, cfg: SmallVLAConfig | dict) -> None:
        super().__init__()
        if isinstance(cfg, dict):  # from config.json (from_pretrained)
            cfg = SmallVLAConfig(**cfg)
        self.cfg = cfg
        d = cfg.d_model
        self.tokenizer = InstructionTokenizer(cfg.vocab_size, cfg.max_words)
        self.image_enc = FiLMEncoder(d, d)
        n_patches = (cfg.image_size // 16) ** 2
        self.patch_pos = nn.Parameter(torch.randn(1, n_patches, d) * 0.02)
        self.word_emb = nn.Embedding(cfg.vocab_size, d, padding_idx=PAD_ID)
        self.word_pos = nn.Parameter(torch.randn(1, cfg.max_words, d) * 0.02)
        self.locator = TargetLocator(d, cfg.locator_channels) if cfg.locator else None
        state_in = cfg.state_dim + (4 if cfg.locator else 0)
        self.state_proj = nn.Sequential(nn.Linear(state_in, d), nn.GELU(), nn.Linear(d, d))
        self.queries = nn.Parameter(torch.randn(1, cfg.action_dim, d) * 0.02)
        self.type_emb = nn.Parameter(torch.randn(4, d) * 0.02)  # patch, word, state, query
        layer = nn.TransformerEncoderLayer(
            d, cfg.n_heads, dim_feedforward=4 * d, dropout=cfg.dropout, batch_first=True, norm_first=True
        )
        self.transformer = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg.n_bins)
        self.register_buffer("centers", bin_centers(cfg.n_bins), persistent=False)

    # ------------------------------------------------------------------ forward
    def forward(self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, A, n_bins]`` from images ``[B, 3, H, W]`` uint8 (or ``[B, H, W, 3]``),
        states ``[B, S]`` and instruction ids ``[B, L]``: :meth:`visual_features` of the frames, then
        :meth:`logits_from_features`."""
        images = self._chw(images)
        instr, word_vecs, sentence = self._words(instr, images.shape[0])
        return self._trunk(self._visual(images, sentence), states, instr, word_vecs)

    def visual_features(self, images: torch.Tensor, instr: torch.Tensor) -> torch.Tensor:
        """What the policy takes from a frame, packed ``[B, F]`` (:func:`pack_visual`): the FiLM
        encoder's patch tokens ``[B, P, d]`` and keypoint token ``[B, 1, d]``, then the locator's
        table xy ``[B, 2]`` (if it has one), all conditioned on the instruction ``[B, L]``."""
        images = self._chw(images)
        _, _, sentence = self._words(instr, images.shape[0])
        return self._visual(images, sentence)

    def logits_from_features(
        self, features: torch.Tensor, states: torch.Tensor, instr: torch.Tensor
    ) -> torch.Tensor:
        """Logits ``[B, A, n_bins]`` from packed visual features ``[B, F]`` (:meth:`visual_features`,
        or a latent adapter's estimate of them), states ``[B, S]`` and instruction ids ``[B, L]``."""
        if features.dim() != 2 or features.shape[1] != self.feature_dim:
            raise ValueError(f"features have shape {tuple(features.shape)}, expected [B, {self.feature_dim}]")
        instr, word_vecs, _ = self._words(instr, features.shape[0])
        return self._trunk(features, states, instr, word_vecs)

    def sentence(self, instr: torch.Tensor) -> torch.Tensor:
        """``[B, d]`` mean word embedding of the instruction ids ``[B, L]`` (what conditions the image
        encoder and the locator)."""
        return self._words(instr, instr.shape[0])[2]

    @property
    def feature_dim(self) -> int:
        """``F`` of :meth:`visual_features`: ``(P + 1) * d`` (+ 2 with the locator)."""
        n_patches = (self.cfg.image_size // 16) ** 2
        return (n_patches + 1) * self.cfg.d_model + (2 if self.locator is not None else 0)

    def _words(self, instr: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if instr.dim() != 2 or instr.shape[0] != b or instr.shape[1] > self.cfg.max_words:
            raise ValueError(f"instr has shape {tuple(instr.shape)}, expected ({b}, <= {self.cfg.max_words})")
        # drop the padding columns after the batch's longest instruction: masked tokens change no
        # output, and the transformer's sequence shrinks (38 -> 27 tokens for 5-word instructions)
        words_in = (instr != PAD_ID).any(0).nonzero()
        instr = instr[:, : int(words_in.max()) + 1 if words_in.numel() else 1]
        word_vecs = self.word_emb(instr)  # [B, L, d]
        real = (instr != PAD_ID).float().unsqueeze(-1)
        sentence = (word_vecs * real).sum(1) / real.sum(1).clamp(min=1)  # [B, d] mean of the words
        return instr, word_vecs, sentence

    def _visual(self, images: torch.Tensor, sentence: torch.Tensor) -> torch.Tensor:
        patches, keypoint = self.image_enc(images, sentence)
        loc = self.locator(images, sentence)["xy"] if self.locator is not None else None
        return pack_visual(patches, keypoint, loc)

    def _trunk(
        self, features: torch.Tensor, states: torch.Tensor, instr: torch.Tensor, word_vecs: torch.Tensor
    ) -> torch.Tensor:
        b = features.shape[0]
        if states.shape != (b, self.cfg.state_dim):
            raise ValueError(f"states has shape {tuple(states.shape)}, expected ({b}, {self.cfg.state_dim})")
        t = self.type_emb
        n_patches = (self.cfg.image_size // 16) ** 2
        patches, keypoint, loc = unpack_visual(
            features, n_patches, self.cfg.d_model, self.locator is not None
        )
        patches = torch.cat([patches + self.patch_pos, keypoint], 1) + t[0]  # [B, P+1, d]
        words = word_vecs + self.word_pos[:, : instr.shape[1]] + t[1]  # [B, L, d]
        states = states.float()
        if loc is not None:
            goal = loc * LOC_UNIT  # [B, 2] metres
            states = torch.cat([states, goal / LOC_UNIT, (goal - states[:, :2]) * OFFSET_SCALE], -1)
        state = self.state_proj(states).unsqueeze(1) + t[2]  # [B, 1, d]
        queries = self.queries.expand(b, -1, -1) + t[3]  # [B, A, d]
        x = torch.cat([patches, words, state, queries], dim=1)  # [B, P+L+1+A, d]
        pad = torch.cat(
            [
                torch.zeros(b, patches.shape[1], dtype=torch.bool, device=x.device),
                instr == PAD_ID,
                torch.zeros(b, 1 + self.cfg.action_dim, dtype=torch.bool, device=x.device),
            ],
            dim=1,
        )  # [B, P+L+1+A], True = ignore
        x = self.transformer(x, src_key_padding_mask=pad)
        return self.head(self.norm(x[:, -self.cfg.action_dim :]))  # [B, A, n_bins]

    def _chw(self, images: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4:
            raise ValueError(f"images must be 4-D [B, 3, H, W] or [B, H, W, 3], got {tuple(images.shape)}")
        if images.shape[1] != 3 and images.shape[-1] == 3:
            images = images.permute(0, 3, 1, 2)
        s = self.cfg.image_size
        if images.shape[1:] != (3, s, s):
            raise ValueError(f"images have shape {tuple(images.shape)}, expected [B, 3, {s}, {s}]")
        return images

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def act(
        self,
        images: torch.Tensor,
        states: torch.Tensor,
        instr: torch.Tensor,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
        features: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample one step: returns (bins ``[B, A]`` long, log-probs ``[B, A]`` of the sampled bins
        under the *untempered* policy, continuous actions ``[B, A]``), on the CPU.

        ``temperature`` 0 takes the argmax. The log-probs are those of the policy being trained
        (temperature 1), which is what the clipped ratio compares against. Inputs may live on any
        device (they move to the policy's); sampling draws from ``generator`` (a CPU generator), so a
        seeded rollout samples the same bins on every device given the same logits. ``noise``
        ``[B, A]`` uniforms in [0, 1) replace the generator: bin = the first whose cumulative
        probability exceeds it (inverse CDF), so two rollouts given the same uniforms (common
        random numbers) draw the same bin wherever their distributions agree. ``features`` ``[B, F]``
        (packed visual features, :meth:`visual_features`) replace the frames: ``images`` is then
        ignored (pass None) and no image is encoded.
        """
        if temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0")
        dev = self.centers.device
        if features is not None:
            logits = self.logits_from_features(features.to(dev), states.to(dev), instr.to(dev)).cpu()
        else:
            logits = self(images.to(dev), states.to(dev), instr.to(dev)).cpu()  # [B, A, K]
        if temperature == 0:
            bins = logits.argmax(-1)
        elif noise is not None:
            if noise.shape != logits.shape[:-1]:
                raise ValueError(f"noise has shape {tuple(noise.shape)}, expected {tuple(logits.shape[:-1])}")
            cdf = torch.softmax(logits / temperature, dim=-1).cumsum(-1)
            bins = torch.searchsorted(cdf, noise.float().unsqueeze(-1).contiguous(), right=True).squeeze(-1)
            bins = bins.clamp(max=logits.shape[-1] - 1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            bins = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)
            bins = bins.reshape(logits.shape[:-1])
        logp = torch.log_softmax(logits, -1).gather(-1, bins.unsqueeze(-1)).squeeze(-1)
        return bins, logp, self.centers.cpu()[bins]

    # ------------------------------------------------------------------ scoring
    def step_log_probs(
        self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor, bins: torch.Tensor
    ) -> torch.Tensor:
        """``[B, A]`` log-probs of ``bins`` ``[B, A]`` (differentiable)."""
        logits = self(images, states, instr)
        return torch.log_softmax(logits, -1).gather(-1, bins.unsqueeze(-1)).squeeze(-1)

    def log_probs(self, batch, chunk: int = 512) -> torch.Tensor:  # batch: wmrl.domain.RolloutBatch
        """``[N, T*A]`` log-probs of ``batch.tokens`` (differentiable), from ``batch.extras``:
        ``images`` ``[N, T, 3, H, W]`` uint8, ``states`` ``[N, T, S]``, ``instr`` ``[N, L]``; rollouts
        imagined on the world model's latent (``latent`` ``[N]`` bool, optional) are scored on their
        stored visual features (``features`` ``[N, T, F]``) instead of their frames.
        Padding steps (mask 0) are scored too (their values are ignored by the loss) but only the
        real steps go through the network."""
        ex = batch.extras
        for k in ("images", "states", "instr"):
            if k not in ex:
                raise KeyError(f"batch.extras lacks {k!r}; SmallVLA.log_probs needs images, states, instr")
        images, states, instr = ex["images"], ex["states"], ex["instr"]
        n, t = images.shape[:2]
        a = self.cfg.action_dim
        if batch.tokens.shape != (n, t * a):
            raise ValueError(f"tokens have shape {tuple(batch.tokens.shape)}, expected ({n}, {t}*{a})")
        latent = ex.get("latent")
        if latent is not None and bool(latent.any()) and "features" not in ex:
            raise KeyError("batch.extras marks latent-imagined rollouts but lacks 'features' [N, T, F]")
        step_mask = batch.mask.reshape(n, t, a).amax(-1) > 0  # [N, T]
        flat_state = states.reshape(n * t, -1)
        flat_instr = instr.unsqueeze(1).expand(n, t, instr.shape[-1]).reshape(n * t, -1)
        flat_bins = batch.tokens.reshape(n * t, a)
        out = torch.zeros(n * t, a, device=images.device)
        on_latent = torch.zeros(n, t, dtype=torch.bool, device=step_mask.device)
        if latent is not None:
            on_latent = latent.to(step_mask.device).bool().unsqueeze(1).expand(n, t)
        for from_features in (False, True):
            idx = (step_mask & (on_latent == from_features)).reshape(-1).nonzero().squeeze(-1)  # flat
            if not idx.numel():
                continue
            src = ex["features"] if from_features else images  # [N, T, F] or [N, T, 3, H, W]
            flat_in = src.reshape(n * t, *src.shape[2:])
            pieces = []
            for s in range(0, idx.numel(), chunk):
                j = idx[s : s + chunk]
                if from_features:
                    logits = self.logits_from_features(flat_in[j].float(), flat_state[j], flat_instr[j])
                else:
                    logits = self(flat_in[j], flat_state[j], flat_instr[j])
                pieces.append(
                    torch.log_softmax(logits, -1).gather(-1, flat_bins[j].unsqueeze(-1)).squeeze(-1)
                )
            out = out.index_put((idx,), torch.cat(pieces))
        return out.reshape(n, t * a)

    # ------------------------------------------------------------------ persistence
    def save(self, path) -> None:
        torch.save({"config": asdict(self.cfg), "state_dict": self.state_dict()}, path)

    @classmethod
    def load(cls, path) -> SmallVLA:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        # checkpoints from before the locator existed have none
        model = cls(SmallVLAConfig(**{"locator": False, **ckpt["config"]}))
        model.load_state_dict(ckpt["state_dict"])
        return model
