"""One rank of the data-parallel SFT run of tests/core/test_sft_distributed.py, started by ``torchrun``.

``python sft_dp_worker.py ROOT``: loads the demos the test wrote under ``ROOT``, runs the small VLA's
behaviour cloning with an accelerate ``Accelerator`` (DDP over gloo), and the main process saves the
final parameters and figures to ``ROOT/two.pt``.
"""

import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).parent))

from accelerate import Accelerator  # noqa: E402
from test_sft_distributed import setup, vla_sft  # noqa: E402


def main(root: Path) -> None:
    acc = Accelerator(cpu=True)
    vla = setup(root)
    hist = vla_sft(vla, acc)
    if acc.is_main_process:
        torch.save(
            {"vla": vla["policy"].state_dict(), "vla_hist": hist, "world": acc.num_processes}, root / "two.pt"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
