"""Data-parallel training through accelerate (wmrl/distributed.py): a 2-process run (``torchrun``,
DDP over gloo on this CPU) gives the 1-process run's updates and metrics; ranks stay in step."""

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from wmrl.config import load_config
from wmrl.distributed import group_owner, join_shares, task_shares
from wmrl.learner import aggregate_denom, clipped_policy_loss
from wmrl.runs import train_run
from wmrl.toy import ToyConfig, ToyDomain
from wmrl.tracking import CHECKPOINT, read_metrics, safe_load

STEPS = 3
# ppi with imagined twin groups (groups appended after the real ones), a KL term, three minibatches
# per step (some hold rows of one rank only) and gradient clipping: every path of the sharded update.
OVERRIDES = [
    "--method=ppi",
    "--seed=3",
    "--domain.type=toy",
    "--domain.twin_anchors=true",
    "--executor.type=inline",
    "--tracking.wandb=disabled",
    "--tracking.progress=false",
    "--tracking.eval_every=1",
    "--grpo.optimizer=sgd",
    "--grpo.lr=2",
    "--grpo.tasks_per_step=8",
    "--grpo.minibatches=3",
    "--grpo.kl_coef=0.05",
    "--grpo.max_grad_norm=0.3",  # below the toy's gradient norms (about 0.45): clipping acts
    f"--grpo.steps={STEPS}",
    "--anchors.fraction=0.25",
    "--ppi.warmup_groups=2",
]


def _close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
def test_share_losses_over_the_global_denominator_sum_to_the_whole_loss(agg):
    """Ranks hold rollouts of different lengths (and one with no real token): each share's loss and
    diagnostics over the whole batch's denominators sum to the whole batch's, so DDP's mean of the
    share gradients times N is the whole gradient. (The toy's one-token rollouts cannot show this.)"""
    g = torch.Generator().manual_seed(0)
    n, t = 7, 5
    theta = torch.randn(n, t, generator=g, requires_grad=True)
    old, ref = torch.randn(n, t, generator=g), torch.randn(n, t, generator=g)
    adv = torch.randn(n, generator=g)
    mask = (torch.arange(t) < torch.tensor([5, 1, 3, 0, 2, 5, 4])[:, None]).float()
    whole, stats = clipped_policy_loss(theta, old, adv, mask, 0.2, agg, ref, 0.1)
    (grad_whole,) = torch.autograd.grad(whole, theta)
    denom, tokens = aggregate_denom(mask, agg), mask.sum()
    total, grad, sums = 0.0, torch.zeros_like(theta), dict.fromkeys(stats, 0.0)
    for rows in (torch.tensor([0, 1]), torch.tensor([2, 3, 4, 5, 6])):
        part, part_stats = clipped_policy_loss(
            theta[rows], old[rows], adv[rows], mask[rows], 0.2, agg, ref[rows], 0.1, denom, tokens
        )
        (g_part,) = torch.autograd.grad(part, theta)
        total, grad = total + part.detach(), grad + g_part
        sums = {k: sums[k] + float(v) for k, v in part_stats.items()}
    torch.testing.assert_close(total, whole.detach())
    torch.testing.assert_close(grad, grad_whole)
    assert all(math.isclose(sums[k], float(stats[k]), rel_tol=1e-5, abs_tol=1e-7) for k in stats)
    # Each share over its own denominator (what plain DDP of the 1-process loss would do) is wrong.
    own = sum(
        float(clipped_policy_loss(theta[r], old[r], adv[r], mask[r], 0.2, agg, ref[r], 0.1)[0])
        for r in (torch.tensor([0, 1]), torch.tensor([2, 3, 4, 5, 6]))
    )
    assert not math.isclose(own / 2, float(whole), rel_tol=1e-3)


def test_task_shares_and_group_owner_keep_groups_whole():
    assert [list(s) for s in task_shares(5, 2)] == [[0, 1, 2], [3, 4]]
    assert [len(s) for s in task_shares(1, 3)] == [1, 0, 0]
    domain = ToyDomain(ToyConfig(twin_anchors=True), seed=0)
    anchors = torch.tensor([True, False, False, True, False])
    batch = domain.generate([4, 7, 1, 9, 2], 3, anchors)  # 5 real groups, then twins of 0 and 3
    owner = group_owner(batch, 5, 2)
    assert owner.tolist() == [0, 0, 0, 1, 1, 0, 1]


def test_join_shares_gives_the_one_process_layout():
    """Each rank's batch (real groups, then its twins) joins into all real groups in task order, then
    all twins pointing at their real groups, rows group-major; the owner is the generating rank."""
    domain = ToyDomain(ToyConfig(twin_anchors=True), seed=0)
    tasks, anchors = [4, 7, 1, 9, 2], torch.tensor([True, False, False, True, True])
    parts = [
        (domain.generate(tasks[:3], 2, anchors[:3]), 3),
        None,  # a rank without a task this step
        (domain.generate(tasks[3:], 2, anchors[3:]), 2),
    ]
    batch, owner, src_rank, src_row = join_shares(parts)
    assert batch.tasks == [4, 7, 1, 9, 2, 4, 9, 2]
    # the twin groups 5, 6, 7 stand for the real groups 0, 3, 4 (rows 2g, 2g + 1)
    assert batch.real_row.tolist() == [-1] * 10 + [0, 1, 6, 7, 8, 9]
    assert batch.group_ids.tolist() == torch.arange(8).repeat_interleave(2).tolist()
    assert torch.equal(batch.extras["context"], torch.tensor(batch.tasks)[batch.group_ids])
    twins = batch.group_ids >= 5
    assert torch.equal(batch.tokens[twins], batch.tokens[batch.real_row[twins]])  # common-noise twins
    assert owner.tolist() == [0, 0, 0, 2, 2, 0, 2, 2]
    assert torch.equal(src_rank, owner[batch.group_ids])
    for r, part in ((0, parts[0]), (2, parts[2])):
        rows = (src_rank == r).nonzero().squeeze(-1)
        assert torch.equal(batch.tokens[rows], part[0].tokens[src_row[rows]])


@pytest.mark.slow
def test_two_processes_give_the_one_process_update(tmp_path):
    """torchrun --nproc_per_node 2: the replicated-generation run, accumulating each minibatch's
    gradient over passes of 3 rollouts, logs the 1-process run's metrics and ends at its parameters; the sharded-generation run keeps both ranks' parameters identical, each
    rank generating only its share, with the same anchor choice and real executions, and a resumed
    shard run ends where the uninterrupted one did."""
    root = tmp_path / "dp"
    root.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("WORLD_SIZE", None)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    worker = str(Path(__file__).parent / "dp_worker.py")
    proc = subprocess.Popen(
        [torchrun, "--standalone", "--nproc_per_node", "2", worker, str(root), *OVERRIDES],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    # The 1-process reference trains here meanwhile.
    one = train_run(load_config(None, [*OVERRIDES, f"--out_dir={tmp_path / 'one'}"]))
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:  # never leave the ranks behind: torchrun and its workers
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]

    ref_rows, rows = read_metrics(tmp_path / "one"), read_metrics(root / "replicate")
    assert [r["step"] for r in rows] == [r["step"] for r in ref_rows] == list(range(STEPS + 1))  # once
    for ref, row in zip(ref_rows, rows, strict=True):
        keys = {k for k in ref if not k.startswith("time/")}
        assert keys == {k for k in row if not k.startswith("time/")}
        diffs = {k: (ref[k], row[k]) for k in keys if not _close(ref[k], row[k])}
        assert not diffs, f"step {ref['step']}: {diffs}"
    assert rows[-1]["loss/optimizer_steps"] == 3 and rows[-1]["exec/real_total"] == one["exec/real_total"]
    summary = json.loads((root / "replicate" / "summary.json").read_text())
    assert _close(summary["eval/true_reward"], one["eval/true_reward"])
    theta_one = safe_load(tmp_path / "one" / CHECKPOINT)["policy"]["theta"]
    theta_two = safe_load(root / "replicate" / CHECKPOINT)["policy"]["theta"]
    assert theta_one.abs().sum() > 0  # the policy moved
    torch.testing.assert_close(theta_two, theta_one, rtol=1e-5, atol=1e-6)

    ranks = [torch.load(root / f"shard-rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert all(r["world"] == 2 for r in ranks)
    assert [r["generated_tasks"] for r in ranks] == [4 * STEPS, 4 * STEPS]  # each its half of 8 a step
    torch.testing.assert_close(ranks[0]["policy"]["theta"], ranks[1]["policy"]["theta"], rtol=0, atol=1e-6)
    assert not torch.allclose(ranks[0]["policy"]["theta"], theta_one)  # its own (independent) samples
    for r in (0, 1):  # stopped after step 1 and resumed on 2 ranks: where the uninterrupted run ended
        resumed = torch.load(root / f"shard-resumed-rank{r}.pt", weights_only=True)
        assert resumed["generated_tasks"] == 4 * (STEPS - 1)
        torch.testing.assert_close(resumed["policy"]["theta"], ranks[r]["policy"]["theta"], rtol=0, atol=1e-6)
    shard_rows = read_metrics(root / "shard")
    assert [r["step"] for r in shard_rows] == list(range(STEPS + 1))
    for ref, row in zip(ref_rows[1:], shard_rows[1:], strict=True):
        for k in ("anchors/fraction", "exec/step", "exec/real_total", "loss/optimizer_steps"):
            assert row[k] == ref[k], k


def test_join_shares_pads_extras_to_the_longest_share():
    """Shares whose extras differ in size (each rank pads to its own longest rollout or prompt) are
    padded to the largest: right with zeros by default, or as the domain's ``extras_padding`` says
    (a left-padded prompt keeps its tokens at the end)."""
    domain = ToyDomain(ToyConfig(), seed=0)
    a, b = (
        domain.generate([1, 2], 2, torch.zeros(2, dtype=torch.bool)),
        domain.generate([3], 2, torch.zeros(1, dtype=torch.bool)),
    )
    a.extras |= {"prompt": torch.tensor([[7, 8]] * 4), "steps": torch.ones(4, 1, 2)}
    b.extras |= {"prompt": torch.tensor([[5, 6, 9]] * 2), "steps": torch.ones(2, 3, 1)}
    batch, _, src_rank, _ = join_shares([(a, 2), (b, 1)], {"prompt": ("left", -1)})
    assert (
        batch.extras["prompt"].tolist()[:4] == [[-1, 7, 8]] * 4
        and batch.extras["prompt"][4:].tolist() == [[5, 6, 9]] * 2
    )
    steps = batch.extras["steps"]
    assert steps.shape == (6, 3, 2) and steps[:4].sum() == 8 and steps[4:].sum() == 6
    assert steps[:4, 1:].abs().sum() == 0 and steps[4:, :, 1:].abs().sum() == 0
    c = domain.generate([4], 2, torch.zeros(1, dtype=torch.bool))
    c.extras["steps"] = torch.ones(2, 3)
    with pytest.raises(ValueError, match="numbers of dims"):
        join_shares([(a, 2), (c, 1)])
