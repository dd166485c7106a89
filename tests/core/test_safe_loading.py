"""Checkpoints and model files load with ``weights_only=True``: a pickle that names code is refused.

The payload below runs ``touch MARKER`` when unpickled. Each loader must refuse it before anything
runs; the last test checks that the payload is live (a plain ``weights_only=False`` load runs it),
so the refusals are not vacuous.
"""

import os
import pickle
import random

import numpy as np
import pytest
import torch

from wmrl.config import load_config
from wmrl.runs import train_run
from wmrl.tracking import CHECKPOINT, RunDirError, load_checkpoint, rng_state, safe_load, set_rng_state

FAST = [
    "--executor.type=inline",
    "--tracking.wandb=disabled",
    "--tracking.progress=false",
    "--grpo.tasks_per_step=4",
    "--grpo.steps=2",
    "--tracking.eval_every=0",
]


class Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil_file(path, marker, wrap):
    torch.save(wrap(Payload(marker)), path)
    return path


def test_resume_checkpoint_is_plain_and_loads_weights_only(tmp_path):
    cfg = load_config(None, [*FAST, f"--out_dir={tmp_path}"])
    train_run(cfg)
    state = torch.load(tmp_path / CHECKPOINT, weights_only=True)  # no allow-list needed
    assert state["step"] == 2 and "theta" in state["policy"]
    assert load_checkpoint(tmp_path, cfg)["step"] == 2


def test_a_malicious_resume_checkpoint_is_refused(tmp_path):
    cfg = load_config(None, [*FAST, f"--out_dir={tmp_path}"])
    train_run(cfg)
    marker = tmp_path / "pwned"
    good = safe_load(tmp_path / CHECKPOINT)
    _evil_file(tmp_path / CHECKPOINT, marker, lambda p: {**good, "domain": p})
    with pytest.raises(RunDirError, match="cannot read checkpoint"):
        load_checkpoint(tmp_path, cfg)
    assert not marker.exists()


@pytest.mark.parametrize(
    "loader",
    ["wmrl_vla.policy:SmallVLA.load", "world_models.vla_dynamics:VLADynamics.load",
     "wmrl_vla.lerobot_bridge:ACTGaussianPolicy.load", "wmrl.tracking:safe_load"],
)  # fmt: skip
def test_model_loaders_refuse_a_malicious_pickle(tmp_path, loader):
    import importlib

    mod, attr = loader.split(":")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    marker = tmp_path / "pwned"
    path = _evil_file(tmp_path / "model.pt", marker, lambda p: {"config": {}, "state_dict": p})
    with pytest.raises(pickle.UnpicklingError):
        obj(path)
    assert not marker.exists()


def test_the_payload_is_live(tmp_path):
    marker = tmp_path / "pwned"
    torch.load(_evil_file(tmp_path / "model.pt", marker, lambda p: p), weights_only=False)
    assert marker.exists()


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    torch.save({"rng": rng_state()}, tmp_path / "rng.pt")
    want = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True)["rng"])
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(want[0], got[0]) and np.array_equal(want[1], got[1]) and want[2] == got[2]


def test_checkpoints_from_before_plain_rng_states_still_load(tmp_path):
    """Older checkpoints hold numpy's RNG state as an array: rebuilt through numpy's array globals only."""
    np.random.seed(5)
    old = np.random.get_state()
    torch.save({"rng": {"numpy": old}}, tmp_path / "old.pt")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "old.pt", weights_only=True)
    loaded = safe_load(tmp_path / "old.pt")["rng"]["numpy"]
    assert loaded[0] == old[0] and np.array_equal(loaded[1], old[1]) and loaded[2:] == old[2:]
