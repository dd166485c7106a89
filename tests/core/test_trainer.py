"""The trainer over the toy domain: metrics, run-directory safety, kill-and-resume equality."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from toy_runs import FAST, toy_config

from wmrl.anchors import choose_anchor_groups
from wmrl.config import AnchorConfig, load_config
from wmrl.methods import get_method
from wmrl.runs import train_run
from wmrl.tracking import CHECKPOINT, RunDirError, read_metrics
from wmrl.trainer import Trainer


def _cfg(tmp_path, *extra):
    return toy_config(f"--out_dir={tmp_path}", *extra)


def test_anchor_selection_fraction_minimum_and_reproducibility():
    cfg = AnchorConfig(fraction=0.25, min_groups=1)

    def count(method, n):
        return get_method(method).n_anchor_groups(n, cfg)

    assert count("wmrl", 16) == 4 and count("mix", 2) == 1
    assert count("real", 16) == 16 and count("wm", 16) == 0
    a = choose_anchor_groups(16, 4, seed=3, step=7)
    assert a.sum() == 4 and torch.equal(a, choose_anchor_groups(16, 4, seed=3, step=7))
    picks = {tuple(choose_anchor_groups(16, 4, seed=3, step=s).tolist()) for s in range(20)}
    assert len(picks) > 10  # a different random subset at each step


def test_one_step_logs_every_metric_and_moves_the_policy(tmp_path):
    cfg = _cfg(tmp_path, "--method=wmrl", "--grpo.steps=6")
    domain = cfg.domain.build(cfg)
    before = domain.policy.theta.detach().clone()
    last = Trainer(cfg, domain).train()
    assert not torch.equal(before, domain.policy.theta.detach())
    for key in [
        "reward/mean",
        "adv/abs_mean",
        "loss/clip_frac",
        "loss/approx_kl",
        "wm/residual_before",
        "wm/residual_after",
        "denoise/s2",
        "denoise/w",
        "anchors/fraction",
        "exec/real_total",
        "time/generate",
        "time/elapsed",
        "time/wm",
        "time/execute",
        "time/update",
        "update_error",
        "eval/true_reward",
    ]:
        assert key in last, key
    assert last["anchors/fraction"] == 0.25 and last["exec/real_total"] == 6 * 2 * 8
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[-1]["denoise/w"] > 1.0  # c fixed after 4 observations, residual > 0


def test_real_and_wm_execute_all_or_nothing(tmp_path):
    real = train_run(_cfg(tmp_path / "r", "--method=real", "--grpo.steps=2"))
    wm = train_run(_cfg(tmp_path / "w", "--method=wm", "--grpo.steps=2"))
    assert real["exec/real_total"] == 2 * 8 * 8 and wm["exec/real_total"] == 0


def test_existing_run_dir_is_never_overwritten(tmp_path):
    train_run(_cfg(tmp_path, "--grpo.steps=2"))
    before = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(RunDirError, match="already holds a run; pass --resume"):
        train_run(_cfg(tmp_path, "--grpo.steps=2"))
    assert (tmp_path / "metrics.jsonl").read_text() == before


def test_checkpoint_that_does_not_match_the_config_is_refused(tmp_path):
    train_run(_cfg(tmp_path, "--grpo.steps=2"))
    cfg = _cfg(tmp_path, "--grpo.steps=4", "--grpo.group_size=4")
    with pytest.raises(
        RunDirError, match=r"does not match the config: grpo.group_size: checkpoint 8 vs config 4"
    ):
        Trainer(cfg, cfg.domain.build(cfg), resume=True)
    with pytest.raises(RunDirError, match="holds no checkpoint"):
        train_run(_cfg(tmp_path / "empty"), resume=True)


def test_a_checkpoint_saved_before_a_field_existed_resumes_as_it_ran(tmp_path):
    """A checkpoint from before ``wm_placebo`` and ``ppi.shrink_confidence`` existed, and holding
    the removed ``domain.progress``: the field whose default keeps training as it was is taken as
    such; the one whose default changes training is named with the override that resumes it."""
    train_run(_cfg(tmp_path, "--method=ppi", "--grpo.steps=2"))
    path = tmp_path / CHECKPOINT
    state = torch.load(path, weights_only=False)
    fingerprint = state["fingerprint"]
    del fingerprint["wm_placebo"], fingerprint["ppi"]["shrink_confidence"]
    fingerprint["domain"]["progress"] = True
    torch.save(state, path)
    cfg = _cfg(tmp_path, "--method=ppi", "--grpo.steps=3")
    with pytest.raises(RunDirError) as err:
        Trainer(cfg, cfg.domain.build(cfg), resume=True)
    message = str(err.value)
    assert "ppi.shrink_confidence: checkpoint None vs config 0.9" in message
    assert "set this value back in" in message and "(ppi.shrink_confidence: null)" in message
    assert "wm_placebo" not in message and "progress" not in message
    cfg = _cfg(tmp_path, "--method=ppi", "--grpo.steps=3", "--ppi.shrink_confidence=null")
    assert Trainer(cfg, cfg.domain.build(cfg), resume=True).step == 2


def _wandb_records(run, timeout: float = 120.0) -> dict[str, list]:
    """The records of an offline wandb run's ``.wandb`` file by type, once its ``exit`` record (the
    last one) is there: wandb's service writes the file in the background."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    deadline = time.monotonic() + timeout
    while True:
        ds = datastore.DataStore()
        ds.open_for_scan(str(next(run.glob("*.wandb"))))
        records: dict[str, list] = {}
        while (data := ds.scan_data()) is not None:
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(data)
            records.setdefault(rec.WhichOneof("record_type"), []).append(rec)
        if "exit" in records or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def test_wandb_offline_writes_a_local_run_with_config_diagnostics_and_media(tmp_path):
    """An offline wandb run beside the run: the run config as wandb's config, every metric (the WM
    diagnostics included) in its history, the domain's rollout table every ``media_every`` steps;
    a Video through the logger becomes a GIF in the run's media/ and in wandb's media."""
    from wmrl.tracking import MetricsLogger, Table, Video

    cfg = load_config(
        None,
        [*FAST, f"--out_dir={tmp_path}", "--tracking.wandb=offline", "--grpo.steps=2", "--method=ppi",
         "--tracking.media_every=2"],
    )  # fmt: skip
    train_run(cfg)
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    tables = sorted((run / "files" / "media" / "table" / "rollouts").glob("table_*.table.json"))
    assert len(tables) == 1  # step 2 only
    table = json.loads(tables[0].read_text())
    assert table["columns"] == ["group", "context", "action", "predicted", "executed", "true"]
    assert len(table["data"]) == 8 * cfg.grpo.group_size
    assert any(r[4] is not None for r in table["data"]) and any(r[4] is None for r in table["data"])
    records = _wandb_records(run)
    keys = {
        item.key or "/".join(item.nested_key) for r in records.get("history", []) for item in r.history.item
    }
    config = {
        item.key: json.loads(item.value_json) for r in records.get("run", []) for item in r.run.config.update
    }
    logged = {k for row in read_metrics(tmp_path) for k in row if k != "step"}  # every metric of the run
    assert {"ppi/lambda", "ppi/rho", "wm/residual_before", "debias/fitted"} <= logged <= keys
    assert config["method"] == "ppi" and config["grpo"]["steps"] == 2  # the run config

    other = tmp_path / "other"
    other.mkdir()
    cfg2 = load_config(None, [*FAST, f"--out_dir={other}", "--tracking.wandb=offline"])
    logger = MetricsLogger(other, cfg2, resume=False)
    frames = np.zeros((3, 3, 8, 16), np.uint8)
    frames[:, 0, :, :8] = 255  # red left half (real); the right half (imagined) brightens
    frames[:, 1, :, 8:] = np.array([0, 100, 200], np.uint8)[:, None, None]
    logger.log(1, {"loss/loss": 0.5})
    logger.log_media(1, {"rollouts/real_vs_imagined": Video(frames, caption="x"), "t": Table(["a"], [[1.0]])})
    with pytest.raises(TypeError, match="not a Video or a Table"):
        logger.log_media(2, {"bad": [1, 2]})
    logger.close()
    gif = other / "media" / "rollouts-real_vs_imagined-step000001.gif"
    from PIL import Image

    with Image.open(gif) as im:
        assert im.n_frames == 3 and im.size == (16, 8)
        assert im.convert("RGB").getpixel((2, 2))[0] > 200 and im.convert("RGB").getpixel((12, 2)) == (
            0,
            0,
            0,
        )
    (run2,) = (other / "wandb").glob("offline-run-*")
    assert list((run2 / "files" / "media" / "videos").rglob("*.gif"))


def _run_cli(args, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "wmrl.cli", *args], env=env, **kw)


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_state(tmp_path):
    preset = tmp_path / "toy-short.yaml"
    preset.write_text("domain: {type: toy, exec_cost_s: 0.01}\nmethod: wmrl\n")
    common = [
        "run",
        str(preset),
        *FAST,
        "--grpo.steps=30",
        "--tracking.checkpoint_every=5",
        "--tracking.eval_every=0",
    ]
    # Uninterrupted reference.
    ref = tmp_path / "ref"
    assert _run_cli([*common, "--out-dir", str(ref)]).wait(timeout=300) == 0
    # A run killed part-way (SIGKILL, no chance to clean up), then resumed.
    run = tmp_path / "run"
    proc = _run_cli([*common, "--out-dir", str(run)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and len(read_metrics(run)) < 12:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_before = len(read_metrics(run))
    assert 12 <= n_before < 30, "the kill must land part-way"
    assert _run_cli(["run", "--resume", str(run)]).wait(timeout=300) == 0

    a = torch.load(ref / CHECKPOINT, weights_only=True)
    b = torch.load(run / CHECKPOINT, weights_only=True)
    assert a["step"] == b["step"] == 30
    assert torch.equal(a["policy"]["theta"], b["policy"]["theta"])
    assert a["method"] == b["method"]
    assert a["real_executions"] == b["real_executions"]
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 31))
    ref_rows = read_metrics(ref)
    assert [r["reward/mean"] for r in rows] == [r["reward/mean"] for r in ref_rows]
    orphans = run / "metrics.orphaned.jsonl"  # rows logged after the last checkpoint are kept aside
    assert n_before % 5 == 0 or (
        orphans.exists() and json.loads(orphans.read_text().splitlines()[0])["step"] > 5
    )


@pytest.mark.parametrize("overlap", [True, False])
def test_wm_update_runs_beside_the_policy_update_only_when_asked(tmp_path, monkeypatch, overlap):
    """Each side waits for the other to start: both see each other only if they run concurrently."""
    import threading

    import wmrl.trainer as trainer_mod

    cfg = _cfg(tmp_path, "--method=wmrl", "--grpo.steps=1", f"--overlap_wm_update={overlap}")
    domain = cfg.domain.build(cfg)
    policy_started, wm_started = threading.Event(), threading.Event()
    seen: dict[str, bool] = {}
    patience = 10.0 if overlap else 0.2
    real_update = trainer_mod.grpo_update

    def policy_update(*args, **kwargs):
        policy_started.set()
        seen["policy saw wm"] = wm_started.wait(patience)
        return real_update(*args, **kwargs)

    def wm_update(batch, indices, rewards):
        wm_started.set()
        seen["wm saw policy"] = policy_started.wait(patience)
        return {"probe": 1.0}

    monkeypatch.setattr(trainer_mod, "grpo_update", policy_update)
    monkeypatch.setattr(domain.world_model, "update", wm_update)
    last = Trainer(cfg, domain).train()
    assert last["wm/probe"] == 1.0 and "time/wm_update" in last and "time/update" in last
    assert seen == {"policy saw wm": overlap, "wm saw policy": True}
