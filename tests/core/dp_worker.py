"""One rank of the data-parallel runs of tests/core/test_distributed.py, started by ``torchrun``.

``python dp_worker.py OUT_ROOT OVERRIDE...`` trains, with the same overrides:
- ``OUT_ROOT/replicate``: ``generation=replicate`` through ``wmrl.runs.train_run`` (the
  command-line path: metrics, checkpoint and summary.json written by the main process), its
  minibatches' gradients accumulated over passes of 3 rollouts (``grpo.micro_batch``; the ranks
  hold different numbers of them);
- ``OUT_ROOT/shard``: ``generation=shard`` through the Trainer, each rank saving its final policy
  to ``OUT_ROOT/shard-rank<r>.pt`` (the ranks' parameters must agree);
- ``OUT_ROOT/shard-resumed``: the same, stopped after one step and resumed from its checkpoint
  (``OUT_ROOT/shard-resumed-rank<r>.pt``; must end where the uninterrupted run ended).
"""

import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from wmrl.config import load_config  # noqa: E402
from wmrl.distributed import make_accelerator  # noqa: E402
from wmrl.runs import train_run  # noqa: E402
from wmrl.tracking import prepare_run_dir  # noqa: E402
from wmrl.trainer import Trainer  # noqa: E402


def main(root: Path, overrides: list[str]) -> None:
    base = [*overrides, "--distributed.enabled=true"]
    train_run(
        load_config(
            None,
            [
                *base,
                "--distributed.generation=replicate",
                "--grpo.micro_batch=3",
                f"--out_dir={root / 'replicate'}",
            ],
        )
    )

    cfg = load_config(None, [*base, "--distributed.generation=shard", f"--out_dir={root / 'shard'}"])
    acc = make_accelerator(cfg)
    if acc.is_main_process:
        prepare_run_dir(root / "shard", resume=False)
    acc.wait_for_everyone()
    trainer = Trainer(cfg, cfg.domain.build(cfg), accelerator=acc)
    trainer.train()
    # The same shard run killed after its first step's checkpoint, then resumed.
    resumed = [*base, "--distributed.generation=shard", f"--out_dir={root / 'shard-resumed'}"]
    first = load_config(None, [*resumed, "--grpo.steps=1"])
    if acc.is_main_process:
        prepare_run_dir(root / "shard-resumed", resume=False)
    acc.wait_for_everyone()
    Trainer(first, first.domain.build(first), accelerator=acc).train()
    again = load_config(None, resumed)
    rest = Trainer(again, again.domain.build(again), resume=True, accelerator=acc)
    rest.train()
    torch.save(
        {
            "policy": rest.policy.state_dict(),
            "generated_tasks": rest.generated_tasks,
        },
        root / f"shard-resumed-rank{acc.process_index}.pt",
    )
    torch.save(
        {
            "policy": trainer.policy.state_dict(),
            "world": acc.num_processes,
            "generated_tasks": trainer.generated_tasks,
        },
        root / f"shard-rank{acc.process_index}.pt",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
