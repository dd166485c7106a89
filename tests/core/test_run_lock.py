"""One process per run directory, and `wmrl status`: a second `wmrl run` / `--resume` / `wmrl
compare` on a directory another process is writing stops with an error naming that process and
touches nothing; a killed process leaves no stale lock; `wmrl status` tells running from stopped
and reads the figures the run wrote. Toy runs in real `wmrl` processes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wmrl.cli import main
from wmrl.status import format_status, left_seconds, remaining_seconds, status, untimed_cells
from wmrl.tracking import CHECKPOINT, RunDirError, exclusive, locked_by, read_metrics

STEPS = 40
FAST = [
    "--executor.type=inline",
    "--tracking.wandb=disabled",
    "--tracking.progress=false",
    "--tracking.eval_every=10",
    "--tracking.checkpoint_every=5",
    "--grpo.tasks_per_step=8",
    f"--grpo.steps={STEPS}",
]


def _hold(directory: Path) -> subprocess.Popen:
    """Another process that holds ``directory``'s lock until killed."""
    code = (
        "import sys, time\nfrom wmrl.tracking import exclusive\n"
        f"with exclusive({str(directory)!r}):\n    print('held', flush=True)\n    time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _tiny_grid_spec(tmp_path: Path, seeds: str) -> Path:
    """`real` alone (no WM method, so no controls) on the toy, 2 steps, inline."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"methods: [real]\nseeds: {seeds}\n"
        "domains:\n  - {name: toy, preset: toy, overrides: [--grpo.steps=2]}\nexecutor: {type: inline}\n"
    )
    return spec


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_the_lock_is_reentrant_names_its_holder_and_dies_with_it(tmp_path):
    with exclusive(tmp_path), exclusive(tmp_path):  # a grid cell locks, then train_run locks again
        assert locked_by(tmp_path).startswith(f"pid {os.getpid()} on ")
    assert locked_by(tmp_path) is None
    other = _hold(tmp_path)
    try:
        assert locked_by(tmp_path).startswith(f"pid {other.pid} on ")
        with pytest.raises(RunDirError, match=f"being written by another process \\(pid {other.pid} on "):
            with exclusive(tmp_path):
                pass
    finally:
        _kill(other)  # SIGKILL: no cleanup runs, the kernel drops the lock
    assert locked_by(tmp_path) is None
    with exclusive(tmp_path):
        assert locked_by(tmp_path).startswith(f"pid {os.getpid()} on ")


def test_a_second_process_on_a_training_run_stops_and_status_tells_running_from_stopped(tmp_path, capfd):
    preset = tmp_path / "toy.yaml"
    preset.write_text("domain: {type: toy, exec_cost_s: 0.03}\nmethod: wmrl\n")
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "wmrl.cli", "run", str(preset), *FAST, "--out-dir", str(run)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not ((run / CHECKPOINT).exists() and len(read_metrics(run)) >= 12):
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the run did not reach step 11"
            time.sleep(0.05)
        running = status(run)["runs"][0]
        assert running["state"] == "running" and running["holder"].startswith(f"pid {proc.pid} ")
        assert running["steps"] == STEPS and 11 <= running["step"] < STEPS
        assert running["score_step"] in (10, 20, 30) and running["eta_s"] > 0
        assert "running (pid " in format_status(status(run))
        rows_before = (run / "metrics.jsonl").read_text()
        capfd.readouterr()
        assert main(["run", "--resume", str(run)]) == 2
        err = capfd.readouterr().err
        assert f"is being written by another process (pid {proc.pid} on " in err, err
        assert (run / "metrics.jsonl").read_text().startswith(rows_before)
        assert proc.poll() is None, "the run ended before it could be killed: slow it (exec_cost_s)"
    finally:
        _kill(proc)
    stopped = status(run)["runs"][0]
    assert stopped["state"] == "stopped" and stopped["holder"] is None and stopped["eta_s"] is None
    assert main(["run", "--resume", str(run)]) == 0
    done = status(run)["runs"][0]
    last = read_metrics(run)[-1]
    assert done["state"] == "finished" and done["step"] == STEPS
    assert done["final"] == done["score"] == last["eval/true_reward"] and done["score_step"] == STEPS


def test_after_sigkill_status_reports_the_checkpoint_step_and_resume_says_what_it_set_aside(tmp_path, capfd):
    """A run killed after logging steps past its last checkpoint (as SIGKILL leaves one): status
    shows the checkpoint's step, where a resume continues, and the steps logged past it; the
    resume says which rows it moved to metrics.orphaned.jsonl."""
    run = tmp_path / "run"
    fast = [a for a in FAST if not a.startswith("--grpo.steps")]
    assert main(["run", "toy", *fast, "--grpo.steps=5", "--out-dir", str(run)]) == 0
    rows = read_metrics(run)
    extra = [dict(rows[-1], step=s) for s in (6, 7, 8)]  # logged, never checkpointed
    with open(run / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in extra)
    (run / "summary.json").unlink()
    saved = run / "config.yaml"
    saved.write_text(saved.read_text().replace("steps: 5", "steps: 10"))
    stopped = status(run)["runs"][0]
    assert stopped["state"] == "stopped" and stopped["step"] == 5 and stopped["checkpoint_step"] == 5
    assert stopped["unsaved_steps"] == 3
    table = format_status(status(run))
    assert " 5/10 " in table and "8/10" not in table
    assert "stopped at its checkpoint (3 steps logged past it, trained again on resume)" in table
    capfd.readouterr()
    assert main(["run", "--resume", str(run)]) == 0
    err = capfd.readouterr().err
    assert (
        f"wmrl: warning: {run}: resuming from the checkpoint of step 5; the 3 metric row(s) logged after "
        "it (steps 6-8, trained again now) moved to metrics.orphaned.jsonl"
    ) in err, err
    assert [r["step"] for r in read_metrics(run)] == list(range(11))  # step 0: eval_every's first
    orphaned = [
        json.loads(line)["step"] for line in (run / "metrics.orphaned.jsonl").read_text().splitlines()
    ]
    assert orphaned == [6, 7, 8]


def test_a_fresh_run_on_a_directory_being_written_before_its_first_checkpoint_moves_nothing(tmp_path, capfd):
    """Before its first checkpoint a run's directory would be reused by a new run (its rows moved
    aside): not while the process writing it runs."""
    preset = tmp_path / "toy.yaml"
    preset.write_text("domain: {type: toy}\nmethod: real\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/true_reward": 0.5}) + "\n")
    other = _hold(run)
    try:
        capfd.readouterr()
        assert main(["run", str(preset), *FAST, "--out-dir", str(run)]) == 2
        assert f"is being written by another process (pid {other.pid} on " in capfd.readouterr().err
        assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", "run.lock"]  # nothing moved
        assert read_metrics(run) == [{"step": 0, "eval/true_reward": 0.5}]
    finally:
        _kill(other)


def test_a_second_compare_on_a_running_grid_stops_before_writing(tmp_path, capsys):
    spec = _tiny_grid_spec(tmp_path, seeds="[0]")
    out = tmp_path / "g"
    out.mkdir()
    other = _hold(out)
    try:
        assert main(["compare", str(spec), "--out-dir", str(out)]) == 2
        assert f"is being written by another process (pid {other.pid} on " in capsys.readouterr().err
        assert sorted(p.name for p in out.iterdir()) == ["run.lock"]  # no spec, ledger or cell written
    finally:
        _kill(other)
    assert main(["compare", str(spec), "--out-dir", str(out)]) == 0
    grid = status(out)
    assert grid["kind"] == "grid" and grid["holder"] is None
    (cell,) = grid["runs"]
    reeval = json.loads((out / "toy/real/seed0/reeval.json").read_text())
    assert cell["state"] == "finished" and cell["final"] == reeval["eval"]["true_reward"]


def test_status_of_a_grid_cell_waiting_for_its_reevaluation_or_start_and_of_no_run(tmp_path, capsys):
    spec = _tiny_grid_spec(tmp_path, seeds="[0, 1]")
    out = tmp_path / "g"
    assert main(["compare", str(spec), "--out-dir", str(out)]) == 0
    assert status(out)["unprepared"] == []
    start = out / "toy/start-seed1.json"
    saved = start.read_bytes()
    start.unlink()  # as while `wmrl compare` builds and evaluates seed 1's start
    assert status(out)["unprepared"] == ["toy seed 1"]
    assert "preparing" not in format_status(status(out))  # no process is preparing it
    other = _hold(out)
    try:
        assert "\npreparing the start of toy seed 1 first (" in format_status(status(out))
    finally:
        _kill(other)
    start.write_bytes(saved)
    (out / "toy/real/seed1/reeval.json").unlink()
    states = {r["name"]: (r["state"], r["final"]) for r in status(out)["runs"]}
    assert states["toy/real/seed1"] == ("trained", None)
    assert states["toy/real/seed0"][0] == "finished" and states["toy/real/seed0"][1] is not None
    capsys.readouterr()
    assert main(["status", str(out), "--json"]) == 0
    assert [r["state"] for r in json.loads(capsys.readouterr().out)["runs"]] == ["finished", "trained"]
    assert main(["status", str(tmp_path)]) == 2
    assert "holds neither a grid" in capsys.readouterr().err
    assert main(["status", str(tmp_path / "typo")]) == 2
    assert "typo does not exist" in capsys.readouterr().err


def test_time_left_is_the_remaining_steps_at_the_recent_pace():
    rows = [{"step": s, "time/step": float(s)} for s in range(1, 21)]  # the last 10 paces: 11..20
    assert remaining_seconds(rows, steps=30) == 10 * 15.5
    assert remaining_seconds(rows, steps=20) == 0.0
    assert remaining_seconds([{"step": 0}], steps=5) is None
    runs = [
        {"code": "real", "state": "finished", "step": 10, "steps": 10, "elapsed_s": 100.0, "eta_s": None},
        {"code": "ppi", "state": "finished", "step": 10, "steps": 10, "elapsed_s": 300.0, "eta_s": None},
        {"code": "ppi", "state": "running", "step": 4, "steps": 10, "elapsed_s": 80.0, "eta_s": 90.0},
        {"code": "ppi", "state": "pending", "step": 0, "steps": 10, "elapsed_s": None, "eta_s": None},
        {"code": "wmrl", "state": "pending", "step": 0, "steps": 10, "elapsed_s": None, "eta_s": None},
    ]
    # the running cell at its own pace; the pending ppi cell (a control, say) at ppi's mean pace
    # (30 and 20 s a step), the pending wmrl cell, no wmrl cell timed, at the mean of all (20 s a step)
    assert left_seconds({"runs": runs, "workers": 2}) == (90.0 + 10 * 25.0 + 10 * 20.0) / 2
    assert untimed_cells({"runs": runs}) == 1  # the wmrl cell
    # re-evaluations: each cell not yet re-evaluated (a trained one included) adds their mean time
    runs[0]["reeval_s"], runs[1]["reeval_s"] = 20.0, 40.0
    # (a trained cell of another method at the overall mean pace, 20 s a step, moves no pace)
    trained = {"code": "mix", "state": "trained", "step": 10, "steps": 10, "elapsed_s": 200.0, "eta_s": None}
    assert (
        left_seconds({"runs": [*runs, trained], "workers": 2})
        == (90.0 + 10 * 25.0 + 10 * 20.0 + 4 * 30.0) / 2
    )
