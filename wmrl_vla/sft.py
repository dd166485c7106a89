"""Behaviour cloning of the small VLA from demonstrations (cross-entropy on binned expert actions).

``uv run python -m wmrl_vla.sft --root DATA --repo-id ID --out policy.pt`` trains from a LeRobot
dataset on disk; :func:`sft` is the library function the VLA domain calls.

Data-parallel: ``accelerate launch -m wmrl_vla.sft ...`` (or :func:`sft` with an ``accelerator``)
runs N processes; every rank draws the same permutation and image shifts (same seed), keeps its
contiguous share of each batch, weights its mean loss by its share of the batch times N, and DDP's
gradient mean is the 1-process gradient of the whole batch. The main process saves the checkpoint.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from wmrl.distributed import task_shares
from wmrl_vla.policy import SmallVLA, SmallVLAConfig, actions_to_bins
from wmrl_vla.vision import LOC_UNIT


@dataclass
class SFTConfig:
    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 1e-4
    # Random image shift of up to this many pixels (pad + crop): cheap augmentation that helps a
    # policy trained on few demos generalise to new object positions.
    shift: int = 0
    # Weight of the auxiliary localisation loss. With the policy's TargetLocator: cross-entropy of its
    # attention map against the named object's pixel + squared error of its table-xy estimate (in
    # LOC_UNIT), labels ``goal`` / ``goal_px`` of each record (from the simulator, see
    # wmrl_vla.demos.label_goals; without them the demo's last hand xy, no pixel term). Without a
    # locator: regress the goal from the image encoder's keypoint token through a small head.
    aux_goal: float = 0.0
    seed: int = 0


def _instruction(rec: dict) -> str:
    for k in ("instruction", "task", "language_instruction"):
        if k in rec:
            v = rec[k]
            return v if isinstance(v, str) else str(np.asarray(v).reshape(-1)[0])
    raise KeyError(f"demo record has no instruction (keys: {sorted(rec)})")


def flatten_demos(records: Sequence[dict], policy: SmallVLA) -> dict[str, torch.Tensor]:
    """LeRobot-style records -> per-frame tensors: images ``[N, 3, H, W]`` uint8, states ``[N, S]``,
    instr ``[N, L]``, bins ``[N, A]``."""
    if not records:
        raise ValueError("no demonstrations to train on")
    from world_models.vla_dynamics import episodes_from_records

    imgs, sts, instr, bins, goals, pxs = [], [], [], [], [], []
    for r, e in zip(records, episodes_from_records(records), strict=True):
        t = len(e["actions"])
        imgs.append(e["images"][:t])
        sts.append(e["states"][:t])
        goal = np.asarray(r["goal"], np.float32) if "goal" in r else e["states"][t - 1, :2]
        goals.append(np.broadcast_to(goal.reshape(-1, 2)[:t], (t, 2)))
        px = np.asarray(r["goal_px"], np.float32) if "goal_px" in r else np.full(2, np.nan, np.float32)
        pxs.append(np.broadcast_to(px.reshape(-1, 2)[:t], (t, 2)))
        instr.append(policy.tokenizer.encode([_instruction(r)]).expand(t, -1))
        bins.append(actions_to_bins(torch.from_numpy(e["actions"]), policy.cfg.n_bins))
    return {
        "images": torch.from_numpy(np.concatenate(imgs)),
        "states": torch.from_numpy(np.concatenate(sts)),
        "instr": torch.cat(instr),
        "bins": torch.cat(bins),
        # [N, 2] the named object's table xy (else the episode's last hand xy) and its image position
        # in [-1, 1]^2 (NaN when unknown)
        "goal": torch.from_numpy(np.concatenate(goals)).float(),
        "goal_px": torch.from_numpy(np.concatenate(pxs)).float(),
    }


def locator_loss(loc: dict[str, torch.Tensor], goal: torch.Tensor, goal_px: torch.Tensor) -> torch.Tensor:
    """Auxiliary loss of a :class:`~wmrl_vla.vision.TargetLocator` output: squared error of its table
    xy (in ``LOC_UNIT``) + cross-entropy of its attention map against the goal's pixel (rows whose
    ``goal_px`` is known)."""
    loss = F.mse_loss(loc["xy"], goal / LOC_UNIT)
    known = torch.isfinite(goal_px).all(-1)
    if known.any():
        n = loc["logits"].shape[-1]
        side = math.isqrt(n)
        uv = ((goal_px[known] + 1) / 2 * side - 0.5).round().long().clamp(0, side - 1)  # [K, 2] col, row
        loss = loss + F.cross_entropy(loc["logits"][known], uv[:, 1] * side + uv[:, 0])
    return loss


def random_shift(images: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """``[B, 3, H, W]`` -> same shape, each image shifted by up to ``pad`` pixels (edge padding)."""
    if pad <= 0:
        return images
    b, _, h, w = images.shape
    padded = F.pad(images.float(), (pad, pad, pad, pad), mode="replicate")
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    rows = (dy[:, None] + torch.arange(h)[None]).clamp(max=h + 2 * pad - 1)  # [B, H]
    cols = (dx[:, None] + torch.arange(w)[None]).clamp(max=w + 2 * pad - 1)  # [B, W]
    out = padded[
        torch.arange(b)[:, None, None, None],
        torch.arange(3)[None, :, None, None],
        rows[:, None, :, None],
        cols[:, None, None, :],
    ]
    return out.to(images.dtype)


class BCModel(torch.nn.Module):
    """The policy and its optional auxiliary goal head as one module, ``forward`` the policy's: what
    DDP / FSDP wrap, so that both are synchronised (the locator / encoder hooks still fire)."""

    def __init__(self, policy: SmallVLA, aux_head: torch.nn.Module | None = None):
        super().__init__()
        self.policy, self.aux_head = policy, aux_head

    def forward(self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor) -> torch.Tensor:
        return self.policy(images, states, instr)


def sft(
    policy: SmallVLA,
    records: Sequence[dict],
    cfg: SFTConfig | None = None,
    progress: bool = True,
    accelerator=None,
) -> dict[str, list[float]]:
    """Train ``policy`` in place by behaviour cloning. Returns per-epoch ``loss`` and ``accuracy``
    (fraction of action tokens whose argmax is the expert's bin).

    With an ``accelerator``: each rank trains on its share of every batch through the prepared
    (DDP / FSDP) :class:`BCModel`; each share's loss is weighted by ``|share| / |batch| * N`` so that
    the gradient mean is the whole batch's; the figures returned are the whole batch's (summed over
    ranks)."""
    from tqdm.auto import tqdm

    cfg = cfg or SFTConfig()
    world = 1 if accelerator is None else accelerator.num_processes
    rank = 0 if accelerator is None else accelerator.process_index
    dev = policy.centers.device  # train where the policy lives (--device)
    data = {k: v.to(dev) for k, v in flatten_demos(records, policy).items()}
    n = data["bins"].shape[0]
    g = torch.Generator().manual_seed(cfg.seed)
    params = list(policy.parameters())
    feats: list[torch.Tensor] = []
    hook = aux_head = None
    use_locator = cfg.aux_goal > 0 and getattr(policy, "locator", None) is not None
    if use_locator:
        hook = policy.locator.register_forward_hook(lambda m, i, o: feats.append(o))
    elif cfg.aux_goal > 0:
        d = policy.cfg.d_model
        aux_head = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU(), torch.nn.Linear(d, 2)).to(dev)
        params += list(aux_head.parameters())
        hook = policy.image_enc.register_forward_hook(lambda m, i, o: feats.append(o[1][:, 0]))
        g_mean, g_std = data["goal"].mean(0), data["goal"].std(0).clamp(min=1e-3)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_total = cfg.epochs * max(1, (n + cfg.batch_size - 1) // cfg.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=steps_total, pct_start=0.1)
    model = BCModel(policy, aux_head)
    if accelerator is not None:  # the scheduler stays on the plain optimizer: one step per step
        model, opt = accelerator.prepare(model, opt)
        params = [p for p in model.parameters() if p.requires_grad]  # FSDP's own (flat) parameters
    hist: dict[str, list[float]] = {"loss": [], "accuracy": []}
    policy.train()
    bar = tqdm(total=steps_total, desc="SFT", disable=not progress or rank != 0)
    for _ in range(cfg.epochs):
        perm = torch.randperm(n, generator=g)
        sums = torch.zeros(4, dtype=torch.float64)  # loss * rows, correct tokens, tokens, goal error
        for s in range(0, n, cfg.batch_size):
            batch = perm[s : s + cfg.batch_size]
            images = random_shift(data["images"][batch], cfg.shift, g)  # the whole batch's shifts
            share = task_shares(len(batch), world)[rank]
            idle = len(share) == 0  # a rank without rows runs one row times 0 (DDP needs every rank)
            sl = slice(0, 1) if idle else slice(share.start, share.stop)
            j = batch[sl]
            weight = 0.0 if idle else len(j) / len(batch) * world
            logits = model(images[sl], data["states"][j], data["instr"][j])
            target = data["bins"][j]
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
            total = loss
            if use_locator:
                loc = feats.pop()
                feats.clear()
                total = loss + cfg.aux_goal * locator_loss(loc, data["goal"][j], data["goal_px"][j])
                if not idle:
                    sums[3] += float((loc["xy"].detach() * LOC_UNIT - data["goal"][j]).norm(dim=-1).sum())
            elif hook is not None:
                pred = aux_head(feats.pop())
                feats.clear()
                total = loss + cfg.aux_goal * F.mse_loss(pred, (data["goal"][j] - g_mean) / g_std)
            opt.zero_grad()
            if accelerator is None:
                total.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
            else:
                accelerator.backward(total * weight)
                accelerator.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            if not idle:
                sums[0] += float(loss.detach()) * len(j)
                sums[1] += int((logits.argmax(-1) == target).sum())
                sums[2] += target.numel()
            bar.update(1)
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
        if accelerator is not None:
            sums = accelerator.reduce(sums.to(accelerator.device), "sum").cpu()
        tot, correct, count, gerr = sums.tolist()
        hist["loss"].append(tot / n)
        hist["accuracy"].append(correct / count)
        if use_locator:  # mean distance (m) of the locator's table xy from the goal label
            hist.setdefault("goal_error", []).append(gerr / n)
    bar.close()
    if hook is not None:
        hook.remove()
    policy.eval()
    return hist


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Behaviour cloning of the small VLA from a LeRobot dataset")
    p.add_argument("--root", required=True, help="LeRobot dataset root directory")
    p.add_argument("--repo-id", required=True)
    p.add_argument("--out", required=True, help="where to save the policy checkpoint (.pt)")
    p.add_argument("--epochs", type=int, default=SFTConfig.epochs)
    p.add_argument("--batch-size", type=int, default=SFTConfig.batch_size)
    p.add_argument("--lr", type=float, default=SFTConfig.lr)
    p.add_argument("--n-bins", type=int, default=21)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from wmrl_vla.data import load_episodes

    torch.set_num_threads(1)
    from world_models.vla_dynamics import episodes_from_records

    records = load_episodes(a.root, a.repo_id)
    first = episodes_from_records(records[:1])[0]  # images [T, 3, H, W], whatever the record's keys
    cfg = SmallVLAConfig(
        image_size=int(first["images"].shape[-1]),
        state_dim=int(first["states"].shape[-1]),
        action_dim=int(first["actions"].shape[-1]),
        n_bins=a.n_bins,
    )
    torch.manual_seed(a.seed)
    acc = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # accelerate launch / torchrun with N processes
        from accelerate import Accelerator

        acc = Accelerator(cpu=not torch.cuda.is_available())
    policy = SmallVLA(cfg).to("cpu" if acc is None else acc.device)
    main_process = acc is None or acc.is_main_process
    sft_cfg = SFTConfig(epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, seed=a.seed)
    hist = sft(policy, records, sft_cfg, progress=main_process, accelerator=acc)
    if not main_process:
        return
    policy.save(a.out)
    print(f"saved {a.out}: final loss {hist['loss'][-1]:.4f}, token accuracy {hist['accuracy'][-1]:.3f}")


if __name__ == "__main__":
    main()
