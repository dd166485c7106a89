"""A small vision-language-action policy trained from scratch, with discretised action tokens.

Inputs per time step: an RGB frame ``[3, H, W]`` (uint8), proprioception ``[S]`` and an instruction
(word ids from :class:`InstructionTokenizer`). A small CNN turns the frame into ``(H/16) * (W/16)``
patch tokens (plus a keypoint token), each instruction word is one token, proprioception is one token, and ``A`` learned
query tokens (one per action dimension) read them through a small transformer encoder. Each query
emits logits over ``n_bins`` bins of its action dimension in ``[-1, 1]``. The CNN is conditioned on
the instruction (FiLM) and adds one spatial-softmax keypoint token (see :class:`FiLMEncoder`).

The action dimensions are independent given the observation, so the log-prob of a step is the sum
of ``A`` exact categorical log-probs and the core's token-level clipped-ratio loss applies with one
token per (step, action dimension): a rollout of ``T`` steps has ``T * A`` tokens, step-major.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

PAD_ID = 0
KP_SCALE_INIT = 10.0


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


class FiLMEncoder(nn.Module):
    """Instruction-conditioned CNN (FiLM, as in RT-1) with a spatial-softmax keypoint readout.

    ``[B, 3, H, W]`` uint8 + a conditioning vector ``[B, c]`` -> patch tokens ``[B, (H/16)*(W/16), d]``
    and one keypoint token ``[B, 1, d]``. The keypoint token holds the expected image coordinates of
    every channel's activation (a spatial softmax, Levine et al. 2016, arXiv:1504.00702): with the
    instruction modulating the channels, "where is the red target" becomes a coordinate, which a
    policy trained on a few dozen demos learns far more easily than from raw patches. Two coordinate
    channels (CoordConv) are appended to the input.
    """

    def __init__(self, d: int, cond_dim: int, channels: tuple[int, int, int] = (32, 32, 64)) -> None:
        super().__init__()
        c1, c2, c3 = channels
        self.convs = nn.ModuleList(
            [
                nn.Conv2d(5, c1, 5, stride=2, padding=2),  # H/2
                nn.Conv2d(c1, c2, 3, stride=2, padding=1),  # H/4
                nn.Conv2d(c2, c3, 3, stride=1, padding=1),  # H/4
            ]
        )
        self.film = nn.Linear(cond_dim, 2 * (c1 + c2 + c3))
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)
        self.channels = channels
        self.to_patches = nn.Conv2d(c3, d, 4, stride=4)  # H/16
        self.keypoints = nn.Sequential(nn.Linear(2 * c3, d), nn.GELU(), nn.Linear(d, d))
        # Learnable inverse temperature of the spatial softmax (log scale). At 1 the softmax over
        # small post-GELU activations is nearly uniform, every keypoint sits at the image centre and
        # the policy learns to ignore the image (measured: shuffling the frames left its accuracy on
        # the demos unchanged); a sharp softmax makes the keypoints track the objects.
        self.log_kp_scale = nn.Parameter(torch.tensor(math.log(KP_SCALE_INIT)))

    def forward(self, images: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = images.float() / 127.5 - 1.0  # [B, 3, H, W] in [-1, 1]
        b, _, h, w = x.shape
        ys = torch.linspace(-1, 1, h, device=x.device).view(1, 1, h, 1).expand(b, 1, h, w)
        xs = torch.linspace(-1, 1, w, device=x.device).view(1, 1, 1, w).expand(b, 1, h, w)
        # channels last: oneDNN's convolutions run ~1.5-3x faster on NHWC maps than on NCHW ones on a
        # CPU (benchmarks/vla_step_speed.py); the values agree to float rounding (~1e-6)
        x = torch.cat([x, ys, xs], 1).contiguous(memory_format=torch.channels_last)
        film = self.film(cond).split([2 * c for c in self.channels], dim=-1)
        for conv, fb in zip(self.convs, film, strict=True):
            gamma, beta = fb.chunk(2, dim=-1)  # [B, c] each
            x = F.gelu(conv(x) * (1 + gamma[:, :, None, None]) + beta[:, :, None, None])
        patches = self.to_patches(x).flatten(2).transpose(1, 2)  # [B, P, d]
        _, c, fh, fw = x.shape
        # spatial softmax per channel, taken over the channels-last map's rows (a view, no copy)
        logits = x.permute(0, 2, 3, 1).reshape(b, fh * fw, c) * self.log_kp_scale.exp()  # [B, h*w, C]
        attn = torch.softmax(logits, dim=1).view(b, fh, fw, c)
        ky = (attn.sum(2) * torch.linspace(-1, 1, fh, device=x.device)[:, None]).sum(1)  # [B, C]
        kx = (attn.sum(1) * torch.linspace(-1, 1, fw, device=x.device)[:, None]).sum(1)  # [B, C]
        return patches, self.keypoints(torch.cat([kx, ky], -1)).unsqueeze(1)


# Unit of the locator's table-coordinate output (metres): its head predicts xy / LOC_UNIT.
LOC_UNIT = 0.1
# Scale of "goal - hand" in the proprioception token's input: the scripted experts' actions saturate
# once the hand is a few centimetres from its target (one step moves the hand up to 3 cm).
OFFSET_SCALE = 30.0


# Frames per int32 key of :func:`frame_colours`: the frame's index within its block in the top 7 bits.
COLOUR_BLOCK = 127


def frame_colours(px: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The distinct (frame, colour) pairs of ``b`` frames' pixels ``px`` ``[b * H * W, 3]`` uint8
    (row-major, frame by frame): (their frames ``[U]`` long, their colours ``[U, 3]``, ``inverse``
    ``[b * H * W]`` with ``(frames, colours)[inverse[i]]`` pixel ``i``'s pair), sorted by frame, then by
    colour ``(r << 16) | (g << 8) | b``: ``torch.unique`` of the key ``(frame << 24) | colour``, taken
    over blocks of ``COLOUR_BLOCK`` frames so that each block's key fits an int32 (an int64 sort of an
    update's millions of keys cost ~2x as much)."""
    hw = px.shape[0] // b
    colour = (px[:, 0].int() << 16) | (px[:, 1].int() << 8) | px[:, 2].int()  # [b * H * W]
    frame = torch.arange(COLOUR_BLOCK, dtype=torch.int32, device=px.device).repeat_interleave(hw) << 24
    keys, inverse, found = [], [], 0
    for first in range(0, b, COLOUR_BLOCK):
        pixels = slice(first * hw, min(b, first + COLOUR_BLOCK) * hw)
        key, inv = torch.unique(frame[: pixels.stop - pixels.start] | colour[pixels], return_inverse=True)
        keys.append(key.long() + (first << 24))
        inverse.append(inv + found)
        found += key.numel()
    key = torch.cat(keys)
    return key >> 24, torch.stack([(key >> 16) & 255, (key >> 8) & 255, key & 255], -1), torch.cat(inverse)


class TargetLocator(nn.Module):
    """Where is the named object? An instruction-conditioned attention map over every pixel.

    Per-pixel features (two 1x1 convolutions: colour, not context) are scored against a query from
    the instruction; a softmax over all ``H * W`` pixels gives the expected image coordinates of the
    named object (a keypoint in [-1, 1]^2, full resolution: in a 64x64 frame of the tabletop scene a
    pixel row spans ~1.5 cm of table depth, so a 16x16 map cannot place an object within the 3 cm a
    task needs) and a small MLP maps them to table xy (units of ``LOC_UNIT`` metres). Trained by the
    auxiliary losses of :func:`wmrl_vla.sft.sft` (the target's pixel and table position, labels
    from the simulator at training time only); the policy sees only its outputs.
    """

    def __init__(self, cond_dim: int, channels: int = 16) -> None:
        super().__init__()
        self.pixels = nn.Sequential(
            nn.Conv2d(3, channels, 1), nn.GELU(), nn.Conv2d(channels, channels, 1), nn.GELU()
        )
        self.query = nn.Linear(cond_dim, channels)
        self.log_scale = nn.Parameter(torch.tensor(0.0))
        self.to_xy = nn.Sequential(nn.Linear(2, 64), nn.GELU(), nn.Linear(64, 2))

    def forward(self, images: torch.Tensor, cond: torch.Tensor) -> dict[str, torch.Tensor]:
        """``images`` ``[B, 3, H, W]`` (uint8, or float with the same 0-255 values), ``cond`` ``[B, c]``
        -> ``logits`` ``[B, H*W]`` (the attention map before its softmax), ``keypoint`` ``[B, 2]``
        (image x, y in [-1, 1]) and ``xy`` ``[B, 2]`` (table position / LOC_UNIT)."""
        b, _, h, w = images.shape
        px = images.permute(0, 2, 3, 1).reshape(b * h * w, 3)  # pixels in row-major order
        rows = torch.arange(b, device=px.device).repeat_interleave(h * w)  # each pixel's frame
        if images.dtype == torch.uint8:
            # A pixel's score depends on its colour and its frame's query alone, and a frame has far
            # fewer distinct colours than pixels (a rendered 64x64 frame ~120, a decoded one
            # ~1,300): score each (frame, colour) pair once, the same values at a fraction of the cost.
            rows, px, inverse = frame_colours(px, b)
        else:
            inverse = None
        # ``self.pixels`` as matmuls over channels-last pixels: the maps of its 1x1 convolutions
        conv1, conv2 = self.pixels[0], self.pixels[2]
        feats = F.gelu(F.linear(px.float() / 127.5 - 1.0, conv1.weight.flatten(1), conv1.bias))
        feats = F.gelu(F.linear(feats, conv2.weight.flatten(1), conv2.bias))  # [N, c]
        scores = (feats * self.query(cond)[rows]).sum(-1) * self.log_scale.exp()  # [N]
        logits = (scores if inverse is None else scores[inverse]).view(b, h * w)
        attn = torch.softmax(logits, -1).view(b, h, w)
        ky = (attn.sum(2) * torch.linspace(-1, 1, h, device=images.device)).sum(-1)
        kx = (attn.sum(1) * torch.linspace(-1, 1, w, device=images.device)).sum(-1)
        kp = torch.stack([kx, ky], -1)
        return {"logits": logits, "keypoint": kp, "xy": self.to_xy(kp)}


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
