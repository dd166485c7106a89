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


def _bf16_on() -> bool:
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


def _recording_toy(seen: dict):
    """The toy domain, recording whether bf16 autocast is on where the trainer calls it."""
    from wmrl.toy import SoftmaxPolicy, ToyConfig, ToyDomain, ToyWorldModel

    class Policy(SoftmaxPolicy):
        def log_probs(self, batch):
            seen["log_probs"].append(_bf16_on())
            return super().log_probs(batch)

    class WorldModel(ToyWorldModel):
        def predict(self, batch):
            seen["predict"].append(_bf16_on())
            return super().predict(batch)

    class Domain(ToyDomain):
        def __init__(self):
            super().__init__(ToyConfig(), seed=0)
            self.policy = Policy(self.cfg.n_contexts, self.cfg.n_actions)
            self.world_model = WorldModel(self.problem, self.wm_gen)

        def generate(self, *a):
            seen["generate"].append(_bf16_on())
            return super().generate(*a)

        def evaluate(self, split):
            seen["evaluate"].append(_bf16_on())
            return super().evaluate(split)

    return Domain()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_precision_bf16_autocasts_generation_prediction_update_and_evaluation(tmp_path, precision):
    from wmrl.trainer import Trainer

    cfg = load_config(
        None,
        ["--executor.type=inline", "--tracking.wandb=disabled", "--tracking.progress=false", "--method=ppi",
         "--grpo.steps=2", "--grpo.kl_coef=0.1", "--tracking.eval_every=1", f"--precision={precision}",
         f"--out_dir={tmp_path}"],
    )  # fmt: skip
    seen = {k: [] for k in ("generate", "predict", "log_probs", "evaluate")}
    trainer = Trainer(cfg, _recording_toy(seen))
    trainer.train()
    assert all(seen.values())  # every path was taken
    on = precision == "bf16"
    assert seen["generate"] == seen["predict"] == [on] * 2 and seen["evaluate"] == [on] * 3
    # the update's (and the reference's) forward passes; the update-error diagnostic runs in float32
    assert (True in seen["log_probs"]) if on else not any(seen["log_probs"])
    assert not _bf16_on()  # nothing leaks out of the trainer
    assert trainer.policy.theta.dtype == torch.float32 and trainer.policy.theta.abs().sum() > 0


def test_precision_errors_are_clear(tmp_path):
    from wmrl.device import check_precision
    from wmrl.trainer import Trainer

    with pytest.raises(ConfigError, match="precision='fp16' is not one of fp32, bf16"):
        load_config(None, ["--precision=fp16"])
    with pytest.raises(
        DeviceError, match="precision=bf16 is not supported here: lerobot; use --precision=fp32"
    ):
        check_precision("bf16", torch.device("cpu"), "lerobot")
    check_precision("fp32", torch.device("cpu"), "lerobot")  # fp32 is always fine
    domain = _recording_toy({k: [] for k in ("generate", "predict", "log_probs", "evaluate")})
    domain.bf16_unsupported = "this policy runs in float32 only"
    cfg = load_config(None, ["--tracking.wandb=disabled", "--precision=bf16", f"--out_dir={tmp_path}"])
    with pytest.raises(DeviceError, match="this policy runs in float32 only"):
        Trainer(cfg, domain)
