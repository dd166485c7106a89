"""`wmrl run toy --executor.type=ray` end to end, as a user runs it: the `wmrl` entry point in a
process of its own, which starts its own local Ray cluster. The trainer must start it in the main
thread: a cluster started from the short-lived thread that runs the executions loses its GCS and
raylet within seconds, and the run hangs ("Failed to connect to GCS within 60 seconds")."""

import json
import subprocess
import sys

import pytest
import yaml

TINY = (
    "domain: {type: toy, n_contexts: 8, n_actions: 4}\n"
    "tracking: {wandb: disabled, progress: false, checkpoint_every: 1}\n"
    "grpo: {steps: 3, tasks_per_step: 4, group_size: 4, optimizer: sgd, lr: 10.0}\n"
    "anchors: {fraction: 0.5, max_concurrent: 1}\n"
)


@pytest.mark.slow
def test_wmrl_run_toy_on_a_local_ray_cluster(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "wmrl.cli", "run", str(tmp_path / "tiny.yaml"), "--out-dir", str(run)]
    out = subprocess.run([*cmd, "--executor.type=ray"], capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    assert yaml.safe_load((run / "config.yaml").read_text())["executor"]["type"] == "ray"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    # every step executed its anchor groups (2 of 4 groups x 4 rollouts) on Ray, all graded
    assert [r["exec/step"] for r in rows] == [8.0, 8.0, 8.0]
    assert all(r["exec/ungraded"] == 0 for r in rows) and rows[-1]["exec/real_total"] == 24
    assert json.loads((run / "summary.json").read_text())["exec/real_total"] == 24
