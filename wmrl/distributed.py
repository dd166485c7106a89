"""Data-parallel training through accelerate (``--distributed.enabled=true``, or ``WORLD_SIZE > 1``).

N processes (started by ``torchrun`` or ``accelerate launch``) each hold the whole policy; the
accelerator wraps it in DDP (gloo on the CPU, NCCL on GPUs) and synchronises the gradients. A step:

- every rank samples the same tasks and the same anchor groups (the global seeded choice);
- rank r owns a contiguous share of the step's groups (:func:`task_shares`); a domain's imagined twin
  group belongs to the owner of its real group, so groups are never split across ranks;
- rank r generates its share (``generation="shard"``; or generates the whole step and keeps its
  share, ``"replicate"``) and executes its own anchor rollouts;
- the rollouts (tokens, log-probs, masks, records: small next to the models) and the true rewards
  are gathered to every rank with accelerate's ``gather_object`` (:func:`gather_batches`), so the WM
  scores, the calibration, the denoiser, the ppi tuner, the advantages and the WM's refinement see
  the same global batch and stay identical on every rank;
- the update: each rank's loss covers its own rows, normalised by the *global* token (or sequence)
  count and multiplied by N, so DDP's gradient mean is the 1-process gradient of the whole batch.

Metrics, checkpoints and ``summary.json`` are written by the main process only.
"""

from __future__ import annotations

import os

import torch

from wmrl.config import RunConfig
from wmrl.domain import RolloutBatch, log_probs


def wants_distributed(cfg: RunConfig) -> bool:
    """``distributed.enabled``, or a launcher that started more than one process (``WORLD_SIZE``)."""
    return bool(cfg.distributed.enabled) or int(os.environ.get("WORLD_SIZE", "1")) > 1


def writes_run_dir() -> bool:
    """Whether this process writes the run directory: the only process, or global rank 0 of a
    ``torchrun`` / ``accelerate launch`` (``RANK``). Domains built on every rank use it to keep
    their own run-directory files (execution logs, recorded anchors, videos) to one writer."""
    return int(os.environ.get("RANK", "0")) == 0


def make_accelerator(cfg: RunConfig):
    """The run's ``accelerate.Accelerator``: CPU (gloo) for ``device=cpu`` or when no GPU is present,
    else one GPU per process (NCCL). Created before the domain, so ``cuda`` means this rank's GPU."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    cpu = cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())
    ddp = DistributedDataParallelKwargs(find_unused_parameters=cfg.distributed.find_unused_parameters)
    return Accelerator(cpu=cpu, kwargs_handlers=[ddp])


class LogProbs(torch.nn.Module):
    """The policy's ``log_probs(batch)`` as ``forward``, so that DDP (which hooks ``forward``) wraps it."""

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, batch: RolloutBatch) -> torch.Tensor:
        return log_probs(self.policy, batch)


def task_shares(n_tasks: int, world: int) -> list[range]:
    """Contiguous shares of ``n_tasks`` task indices over ``world`` ranks (sizes differ by at most 1)."""
    base, extra = divmod(n_tasks, world)
    out, start = [], 0
    for r in range(world):
        size = base + (1 if r < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def group_owner(batch: RolloutBatch, n_tasks: int, world: int) -> torch.Tensor:
    """``[n_groups]`` long: the rank that owns each group of a whole-step batch (real groups by
    :func:`task_shares`; a group of twins with the group of the real rows they stand for)."""
    owner = torch.zeros(batch.n_groups, dtype=torch.long)
    for r, share in enumerate(task_shares(n_tasks, world)):
        owner[share.start : share.stop] = r
    if batch.real_row is not None:
        twins = (batch.real_row >= 0).nonzero().squeeze(-1)
        owner[batch.group_ids[twins]] = owner[batch.group_ids[batch.real_row[twins]]]
    return owner


def shard_seed(seed: int, step: int, rank: int) -> int:
    """The seed of rank ``rank``'s sampling noise at ``step`` of a sharded run (a domain's
    ``shard_rng`` reseeds its generation generator with it): independent across ranks and steps, and
    what a resumed run draws again."""
    from wmrl.anchors import hash_seed

    return hash_seed(seed, step, salt=0x5A4D + rank)


def gather_batches(
    local: RolloutBatch | None,
    n_real: int,
    accelerator,
    padding: dict[str, tuple[str, float]] | None = None,
) -> tuple[RolloutBatch, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every rank's share of the step, joined into the batch one process would have generated.

    ``local``: this rank's batch (None for a rank with no task this step), whose first ``n_real``
    groups are its sampled tasks and any later ones imagined twins (``real_row``). The global batch
    holds all real groups first (rank order, so task order is the global one), then all twins, its
    ``real_row`` pointing at their real rows there; rows are group-major; token dimensions are right-padded (mask 0) to the longest share.

    Returns the batch, ``owner`` ``[n_groups]`` (rank of each group), and for each row its source
    rank and its row in that rank's own batch (``[N]`` each).
    """
    from accelerate.utils import gather_object

    item = None if local is None else (local.to(torch.device("cpu")), n_real)
    return join_shares(gather_object([item]), padding)


def pad_to(t: torch.Tensor, shape: tuple[int, ...], value: float, side: str = "right") -> torch.Tensor:
    """``t`` ``[B, d1, d2, ...]`` padded with ``value`` to ``[B, *shape]``: at the end of every dim,
    or (``side="left"``) at the start of dim 1 (left-padded prompts) and the end of the others."""
    if tuple(t.shape[1:]) == tuple(shape):
        return t
    out = torch.full((t.shape[0], *shape), value, dtype=t.dtype)
    idx = [slice(None)] + [slice(0, n) for n in t.shape[1:]]
    if side == "left":
        idx[1] = slice(shape[0] - t.shape[1], shape[0])
    out[tuple(idx)] = t
    return out


def join_shares(
    parts: list[tuple[RolloutBatch, int] | None],
    padding: dict[str, tuple[str, float]] | None = None,
) -> tuple[RolloutBatch, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`gather_batches` once every rank's ``(batch, n_real)`` (or None) is here, rank order.

    ``extras`` whose sizes differ across ranks (each rank pads its own rollouts to its longest) are
    padded to the largest: with ``padding[key] = (side, value)`` (a domain's ``extras_padding``),
    else with zeros at the end of each dim."""
    present = [(r, p) for r, p in enumerate(parts) if p is not None]
    if not present:
        raise RuntimeError("no rank generated anything this step")
    total_real = sum(n for _, (_, n) in present)
    t_max = max(b.tokens.shape[1] for _, (b, _) in present)
    real_off, twin_off = 0, 0
    cols: dict[str, list[torch.Tensor]] = {k: [] for k in ("tokens", "logprobs", "mask")}
    gids, tasks = [], {}
    extras: dict[str, list[torch.Tensor]] = {}
    payload, src_rank, src_row, real_rows = [], [], [], []
    has_twins = any(b.real_row is not None for _, (b, _) in present)
    row_off = 0
    has_payload = all(b.payload for _, (b, _) in present)
    for r, (b, n) in present:
        n_twins = b.n_groups - n
        gmap = torch.cat([real_off + torch.arange(n), total_real + twin_off + torch.arange(n_twins)])
        for g in range(b.n_groups):
            tasks[int(gmap[g])] = b.tasks[g]
        gids.append(gmap[b.group_ids])
        local = b.real_row if b.real_row is not None else torch.full((b.n_rollouts,), -1)
        real_rows.append(torch.where(local >= 0, local + row_off, local))  # rows of the concatenation
        row_off += b.n_rollouts
        pad = t_max - b.tokens.shape[1]
        for k in cols:
            cols[k].append(torch.nn.functional.pad(getattr(b, k), (0, pad)))
        for k, v in b.extras.items():
            extras.setdefault(k, []).append(v)
        if has_payload:
            payload.extend(b.payload)
        src_rank.append(torch.full((b.n_rollouts,), r, dtype=torch.long))
        src_row.append(torch.arange(b.n_rollouts))
        real_off, twin_off = real_off + n, twin_off + n_twins
    for k, vs in extras.items():
        if len({v.dim() for v in vs}) > 1:
            raise ValueError(
                f"RolloutBatch.extras[{k!r}] has different numbers of dims across ranks "
                f"({[tuple(v.shape) for v in vs]}): use --distributed.generation=replicate"
            )
        if len({tuple(v.shape[1:]) for v in vs}) > 1:
            shape = tuple(max(sizes) for sizes in zip(*(v.shape[1:] for v in vs), strict=True))
            side, value = (padding or {}).get(k, ("right", 0))
            extras[k] = [pad_to(v, shape, value, side) for v in vs]
    gid = torch.cat(gids)
    order = torch.argsort(gid, stable=True)
    n_groups = total_real + twin_off
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel())  # each concatenated row's row in the batch
    real_row = torch.cat(real_rows)
    real_row = torch.where(real_row >= 0, position[real_row.clamp(min=0)], real_row)[order]
    batch = RolloutBatch(
        tokens=torch.cat(cols["tokens"])[order],
        logprobs=torch.cat(cols["logprobs"])[order],
        mask=torch.cat(cols["mask"])[order],
        group_ids=gid[order],
        tasks=[tasks[g] for g in range(n_groups)],
        payload=[payload[i] for i in order.tolist()] if has_payload else [],
        extras={k: torch.cat(vs)[order] for k, vs in extras.items()},
        real_row=real_row if has_twins else None,
    )
    rank_of_row, row_in_rank = torch.cat(src_rank)[order], torch.cat(src_row)[order]
    owner = torch.zeros(n_groups, dtype=torch.long)
    owner[batch.group_ids] = rank_of_row
    return batch, owner, rank_of_row, row_in_rank


def gather_rewards(rows: list[int], rewards: list[float], n_rows: int) -> torch.Tensor:
    """``[n_rows]`` true rewards (NaN where no rank executed) from every rank's ``(rows, rewards)``."""
    from accelerate.utils import gather_object

    out = torch.full((n_rows,), float("nan"))
    for part_rows, part_rewards in gather_object([(rows, rewards)]):
        if part_rows:
            out[torch.tensor(part_rows)] = torch.tensor(part_rewards, dtype=torch.float32)
    return out
