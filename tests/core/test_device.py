"""`--device`: parsing, resolution, a one-line error for a device this machine lacks, and batches
that move whole (tensors and extras) to the policy's device."""

import pytest
import torch

from wmrl.cli import main
from wmrl.config import ConfigError, load_config
from wmrl.device import DeviceError, module_device, resolve_device
from wmrl.domain import RolloutBatch


def test_resolve_device_on_a_machine_without_cuda():
    assert not torch.cuda.is_available()  # conftest hides any GPU: CUDA_VISIBLE_DEVICES=""
    assert resolve_device("auto") == torch.device("cpu") == resolve_device("cpu")
    for spec in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(DeviceError, match=f"device='{spec}' but CUDA is not available here"):
            resolve_device(spec)
    with pytest.raises(DeviceError, match="is not one of auto, cpu, cuda, cuda:N"):
        resolve_device("gpu")


def test_config_rejects_a_malformed_device():
    assert load_config(None, ["--device=cuda:1"]).device == "cuda:1"  # syntax only at parse time
    for bad in ("gpu", "cuda:x", "CPU", "cuda:-1"):
        with pytest.raises(ConfigError, match=f"device='{bad}' is not one of auto, cpu, cuda, cuda:N"):
            load_config(None, [f"--device={bad}"])


def test_cli_reports_an_unavailable_device_in_one_line(tmp_path, capsys):
    preset = tmp_path / "p.yaml"
    preset.write_text(
        "domain: {type: toy}\nexecutor: {type: inline}\ntracking: {wandb: disabled, progress: false}\n"
    )
    assert main(["run", str(preset), "--out-dir", str(tmp_path / "run"), "--device=cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("wmrl: error: device='cuda' but CUDA is not available")
    assert not (tmp_path / "run").exists()  # refused before anything was prepared


def test_rollout_batch_moves_every_tensor_and_keeps_the_rest():
    batch = RolloutBatch(
        tokens=torch.zeros(4, 3, dtype=torch.long),
        logprobs=torch.zeros(4, 3),
        mask=torch.ones(4, 3),
        group_ids=torch.tensor([0, 0, 1, 1]),
        tasks=["a", "b"],
        payload=[{"i": i} for i in range(4)],
        extras={
            "images": torch.zeros(4, 2, 3, 8, 8, dtype=torch.uint8),
            "instr": torch.ones(4, 5, dtype=torch.long),
        },
    )
    assert batch.to("cpu") is batch  # already there: no copy
    moved = batch.to("meta")  # a real second device that exists on every machine
    tensors = [moved.tokens, moved.logprobs, moved.mask, moved.group_ids, *moved.extras.values()]
    assert all(t.device.type == "meta" for t in tensors)
    assert moved.extras["images"].dtype == torch.uint8 and moved.extras.keys() == batch.extras.keys()
    assert moved.payload is batch.payload and moved.tasks is batch.tasks
    assert module_device(torch.nn.Linear(2, 2).to("meta")).type == "meta"
