"""Data-parallel behaviour cloning through accelerate (wmrl_vla/sft.py): 2 processes (``torchrun``,
DDP over gloo on this CPU), each on its share of every batch, end at the 1-process run's parameters
and report its figures. (The research agent's share of the SFT loss: tests/research/test_sft.py.)"""

import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from wmrl_vla.policy import SmallVLA, SmallVLAConfig
from wmrl_vla.sft import SFTConfig, sft


def _demos(n_episodes: int = 3, steps: int = 7) -> list[dict]:
    """LeRobot-style demo records of random frames and actions (behaviour cloning does not care
    where they came from; the equivalence holds for any data)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for e in range(n_episodes):
        image = torch.randint(0, 255, (steps, 16, 16, 3), generator=g, dtype=torch.uint8)
        out.append(
            {
                "observation.image": image.numpy(),
                "observation.state": torch.randn(steps, 7, generator=g).numpy(),
                "action": (torch.rand(steps, 4, generator=g) * 2 - 1).numpy(),
                "next.reward": torch.linspace(0, 1, steps).numpy(),
                "next.success": (torch.arange(steps) == steps - 1).float().numpy(),
                "instruction": ["reach the red cube", "reach the blue cube", "push the green cube"][e],
            }
        )
    return out


def setup(root: Path) -> dict:
    """The starting policy (seeded) and the demos the test wrote (one source for every process)."""
    torch.manual_seed(0)
    cfg = SmallVLAConfig(image_size=16, state_dim=7, action_dim=4, n_bins=5, d_model=16, n_layers=1)
    with open(root / "demos.pkl", "rb") as f:
        return {"policy": SmallVLA(cfg), "demos": pickle.load(f)}


def vla_sft(vla: dict, accelerator=None) -> dict:
    # 21 frames in batches of 8: the last batch (5 rows) splits 3 / 2; image shifts drawn per batch
    cfg = SFTConfig(epochs=2, batch_size=8, lr=1e-2, shift=2)
    return sft(vla["policy"], vla["demos"], cfg, progress=False, accelerator=accelerator)


@pytest.mark.slow
def test_two_process_behaviour_cloning_equals_one_process(tmp_path):
    with open(tmp_path / "demos.pkl", "wb") as f:
        pickle.dump(_demos(), f)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("WORLD_SIZE", None)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    worker = str(Path(__file__).parent / "sft_dp_worker.py")
    proc = subprocess.Popen(
        [torchrun, "--standalone", "--nproc_per_node", "2", worker, str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    vla = setup(tmp_path)  # the 1-process reference trains here meanwhile
    init = {k: v.clone() for k, v in vla["policy"].state_dict().items()}
    hist = vla_sft(vla)
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:  # never leave the ranks behind: torchrun and its workers
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]
    two = torch.load(tmp_path / "two.pt", weights_only=True)
    assert two["world"] == 2
    for key in ("loss", "accuracy"):
        torch.testing.assert_close(two["vla_hist"][key], hist[key], rtol=1e-5, atol=1e-6)
    for k, v in vla["policy"].state_dict().items():
        got = two["vla"][k]
        if k.endswith("self_attn.in_proj_bias"):
            # the key bias (middle third) has an exact zero gradient (softmax ignores it): AdamW turns
            # float noise there into steps of either sign, so only the query and value biases compare
            d = v.shape[0] // 3
            got, v = torch.cat([got[:d], got[2 * d :]]), torch.cat([v[:d], v[2 * d :]])
        torch.testing.assert_close(got, v, rtol=1e-4, atol=1e-4, msg=k)
    assert any(not torch.equal(v, init[k]) for k, v in vla["policy"].state_dict().items())  # it trained
