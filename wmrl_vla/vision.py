"""The small VLA's image encoders (:class:`wmrl_vla.policy.SmallVLA` reads a frame through them).

- :class:`FiLMEncoder`: a small CNN conditioned on the instruction (FiLM) that turns a frame into
  ``(H/16) * (W/16)`` patch tokens plus one spatial-softmax keypoint token;
- :class:`TargetLocator`: a full-resolution locator of the object the instruction names, by colour,
  that outputs its image position and table xy (trained by SFT's auxiliary goal loss,
  :mod:`wmrl_vla.sft`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

KP_SCALE_INIT = 10.0


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
