"""Stopping a run: SIGINT/SIGTERM save the last finished step and say how to continue; a folder
whose run stopped before its first checkpoint is resumed from step 0 or reused; a run whose every
anchor comes back ungraded stops instead of exiting 0. The toy domain (deterministic) in real
``wmrl`` processes, so the signals, exit statuses and stderr are the user's."""

import copy
import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from wmrl.cli import main
from wmrl.config import DomainConfig
from wmrl.domain import Job
from wmrl.signals import SIGNAL_GRACE_S
from wmrl.toy import ToyConfig
from wmrl.tracking import CHECKPOINT, StopSignals, read_metrics

FAST = [
    "--executor.type=inline",
    "--tracking.wandb=disabled",
    "--tracking.progress=false",
    "--tracking.eval_every=0",
    "--grpo.optimizer=sgd",
    "--grpo.lr=20",
    "--grpo.tasks_per_step=8",
    "--debias.warmup_pairs=16",
    "--denoise.warmup_obs=4",
]
STEPS = 8


@pytest.fixture(autouse=True)
def ctrl_c_as_at_a_terminal():
    """Ctrl-C handled as in a terminal's ``wmrl run``, however the suite was launched: a shell's
    background job (``pytest ... &``) starts with SIGINT ignored, which a run keeps (as under nohup)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _preset(tmp_path, exec_cost_s: float):
    """A toy preset whose real executions take ``exec_cost_s`` each (16 anchors a step)."""
    path = tmp_path / f"toy-{exec_cost_s}.yaml"
    path.write_text(f"domain: {{type: toy, exec_cost_s: {exec_cost_s}}}\nmethod: wmrl\n")
    return str(path)


def _args(preset, out, *extra):
    return ["run", preset, *FAST, f"--grpo.steps={STEPS}", "--tracking.checkpoint_every=5", *extra,
            "--out-dir", str(out)]  # fmt: skip


def _start(argv):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "wmrl.cli", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT at its default in the child, whose Python then raises KeyboardInterrupt on it (an
        # ignored SIGINT is inherited, and kept by a run)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_rows(run, n: int, proc, timeout: float = 240) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        rows = len(read_metrics(run)) if (run / "metrics.jsonl").exists() else 0
        if rows >= n:
            return rows
        time.sleep(0.01)
    raise AssertionError(f"the run never logged {n} rows (exit status {proc.poll()})")


def _same_final_state(a, b) -> None:
    """Two runs of the same config ended in the same place: checkpoint and every metric row."""
    ca = torch.load(a / CHECKPOINT, weights_only=True)
    cb = torch.load(b / CHECKPOINT, weights_only=True)
    assert ca["step"] == cb["step"] == STEPS
    assert torch.equal(ca["policy"]["theta"], cb["policy"]["theta"])
    assert ca["method"] == cb["method"]
    assert ca["real_executions"] == cb["real_executions"]
    strip = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_metrics(a)]
    assert strip == [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_metrics(b)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run every stopped-and-continued one must end equal to."""
    root = tmp_path_factory.mktemp("reference")
    assert main(_args(_preset(root, 0.0), root / "ref")) == 0
    return root / "ref"


def _signal_after_rows(run, n: int, signum: int) -> threading.Thread:
    """Send ``signum`` to this process once ``run`` has logged ``n`` metric rows (mid-training)."""

    def watch():
        while not (run / "metrics.jsonl").exists() or len(read_metrics(run)) < n:
            time.sleep(0.005)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_saves_the_last_finished_step_and_resume_ends_as_an_uninterrupted_run(
    tmp_path, reference, signum, capfd
):
    run = tmp_path / "run"
    _signal_after_rows(run, 2, signum)  # before the first checkpoint (step 5)
    capfd.readouterr()
    assert main(_args(_preset(tmp_path, 0.02), run)) == 128 + signum
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    step = len(read_metrics(run))
    name = signal.Signals(signum).name
    assert lines[0] == (
        f"wmrl: stopped by {name} after step {step}, checkpoint of step {step} saved; "
        f"continue it with `wmrl run --resume {run}`"
    )
    assert 2 <= step < 5 and torch.load(run / CHECKPOINT, weights_only=True)["step"] == step
    assert not (run / "summary.json").exists()
    assert main(["run", "--resume", str(run)]) == 0
    _same_final_state(reference, run)


def test_one_sigterm_delivered_twice_is_one_signal_and_saves_the_step_in_progress(tmp_path, capfd):
    """`uv run` forwards the SIGTERM its process group got: the run receives it twice, at once.
    Without the grace interval the copy stopped the run "at once by a second SIGTERM", losing the
    steps since its last checkpoint."""
    run = tmp_path / "run"

    def watch():
        while not (run / "metrics.jsonl").exists() or len(read_metrics(run)) < 2:
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher's copy

    threading.Thread(target=watch, daemon=True).start()
    capfd.readouterr()
    assert main(_args(_preset(tmp_path, 0.02), run)) == 128 + signal.SIGTERM
    err = capfd.readouterr().err
    step = len(read_metrics(run))
    assert err.strip().splitlines() == [
        f"wmrl: stopped by SIGTERM after step {step}, checkpoint of step {step} saved; "
        f"continue it with `wmrl run --resume {run}`"
    ]
    assert torch.load(run / CHECKPOINT, weights_only=True)["step"] == step


def test_stop_signals_count_a_copy_within_the_grace_as_the_first_and_a_later_one_as_second():
    previous = signal.signal(signal.SIGTERM, lambda *a: None)  # as `wmrl run` installs one
    try:
        with StopSignals(grace_s=0.3) as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # a copy: no KeyboardInterrupt
            assert stop.signum == signal.SIGTERM
            time.sleep(0.4)
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)  # the handler runs between bytecodes; it raises here at the latest
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.slow
def test_second_signal_stops_at_once_and_a_folder_without_checkpoint_resumes_or_is_reused(
    tmp_path, reference, capfd
):
    run = tmp_path / "run"
    proc = _start(_args(_preset(tmp_path, 0.2), run))  # a step takes about 3.2 s
    rows = _wait_rows(run, 1, proc)
    _wait_rows(run, rows + 1, proc)  # a step has just begun
    proc.send_signal(signal.SIGINT)
    time.sleep(SIGNAL_GRACE_S + 0.3)  # a deliberate second signal, not a copy of the first
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    step = len(read_metrics(run))
    assert err.strip().splitlines() == [
        f"wmrl: stopped at once by a second SIGINT during step {step + 1}, before its first "
        f"checkpoint; continue it with `wmrl run --resume {run}` (from step 0: no step was saved)"
    ]
    assert not (run / CHECKPOINT).exists() and (run / "config.yaml").exists()
    reused = tmp_path / "reused"
    shutil.copytree(run, reused)
    old_rows = (run / "metrics.jsonl").read_text()

    capfd.readouterr()
    assert main(["run", "--resume", str(run)]) == 0  # from step 0, with its own config
    warning = capfd.readouterr().err
    assert f"wmrl: warning: {run} holds no checkpoint" in warning and "training it from step 0" in warning
    assert (run / "metrics.orphaned.jsonl").read_text() == old_rows  # kept, not deleted
    # the same run from step 0 (its executions cost 0.05 s each: only the cost differs from the reference)
    assert [r["step"] for r in read_metrics(run)] == list(range(1, STEPS + 1))
    a, b = (torch.load(p / CHECKPOINT, weights_only=True) for p in (reference, run))
    assert torch.equal(a["policy"]["theta"], b["policy"]["theta"])

    # a new run (another config) reuses the folder: the stopped run's rows and config are kept aside
    old_config = (reused / "config.yaml").read_text()
    assert main(_args(_preset(tmp_path, 0.0), reused)) == 0
    assert (reused / "metrics.orphaned.jsonl").read_text() == old_rows
    assert (reused / "config.orphaned.yaml").read_text() == old_config
    _same_final_state(reference, reused)


def test_resume_after_config_yaml_was_edited_gives_advice_that_works(tmp_path, capfd):
    """``--resume`` takes no overrides: the refusal says to set the value back in config.yaml (which
    then resumes), or to start a new run from the edited config (which then trains)."""
    import yaml

    run = tmp_path / "run"
    assert main(_args(_preset(tmp_path, 0.0), run, "--grpo.steps=2")) == 0
    saved = run / "config.yaml"
    original = yaml.safe_load(saved.read_text())
    edited = copy.deepcopy(original)
    edited["grpo"]["steps"], edited["grpo"]["lr"] = 4, 5.0  # more steps (allowed), another lr (not)
    saved.write_text(yaml.safe_dump(edited))
    capfd.readouterr()
    assert main(["run", "--resume", str(run)]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "--grpo.lr" not in err, err
    assert "grpo.lr: checkpoint 20.0 vs config 5.0" in err
    assert f"set this value back in {saved} (grpo.lr: 20.0) and rerun `wmrl run --resume {run}`" in err
    assert f"start a new run from it: `wmrl run {saved} --out-dir NEW_DIR`" in err
    assert torch.load(run / CHECKPOINT, weights_only=True)["step"] == 2  # nothing touched

    new = tmp_path / "new"  # the second advice, followed
    assert main(["run", str(saved), "--out-dir", str(new)]) == 0
    assert [r["step"] for r in read_metrics(new)] == [1, 2, 3, 4]
    edited["grpo"]["lr"] = 20.0  # the first advice, followed
    saved.write_text(yaml.safe_dump(edited))
    assert main(["run", "--resume", str(run)]) == 0
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),
    ],
)
def test_a_full_disk_during_a_checkpoint_says_so_keeps_the_last_one_and_leaves_no_temp_file(
    tmp_path, monkeypatch, capfd, failure
):
    run = tmp_path / "run"
    real_save, saves = torch.save, []

    def save_until_full(obj, f, *args, **kwargs):
        saves.append(obj["step"])
        if len(saves) == 1:
            return real_save(obj, f, *args, **kwargs)
        f.write(b"PK partial")  # the disk filled up mid-write
        raise failure

    monkeypatch.setattr(torch, "save", save_until_full)
    capfd.readouterr()
    argv = _args(_preset(tmp_path, 0.0), run, "--tracking.checkpoint_every=2", "--grpo.steps=6")
    assert main(argv) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"wmrl: error: cannot save the checkpoint of step 4 in {run / CHECKPOINT}: the disk is full ("
    ), err
    assert err.endswith(
        " MiB free); the last checkpoint (step 2) is kept and the partial file removed; free space, then "
        f"`wmrl run --resume {run}` continues from step 2\n"
    ), err
    assert not (run / "checkpoints" / "latest.tmp").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest.json", "latest.pt"]
    assert torch.load(run / CHECKPOINT, weights_only=True)["step"] == 2
    monkeypatch.setattr(torch, "save", real_save)  # space freed
    assert main(["run", "--resume", str(run)]) == 0
    assert torch.load(run / CHECKPOINT, weights_only=True)["step"] == 6
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 7))


def _baseline_fails() -> float:
    raise RuntimeError("task toy: the baseline failed here (exit status 1)")


@DomainConfig.register_subclass("toy_broken_env")
@dataclass
class BrokenEnvToyConfig(ToyConfig):
    """The toy problem in an environment where every real execution fails (as a research task
    whose baseline does not run on this machine): each job raises, so every anchor is ungraded."""

    def build(self, run):
        domain = super().build(run)
        domain.execution_jobs = lambda batch, indices: [Job(_baseline_fails, ()) for _ in indices]
        return domain


def test_a_run_whose_anchors_all_come_back_ungraded_stops_with_its_checkpoint(tmp_path, capfd):
    """The run stops after tracking.max_ungraded_steps such steps in a row: exit 2, one line that
    names the first error and how to continue, a warning for each such step before it."""
    preset = tmp_path / "broken.yaml"
    preset.write_text("domain: {type: toy_broken_env}\nmethod: wmrl\n")
    out = tmp_path / "run"
    capfd.readouterr()
    assert main(_args(str(preset), out, "--tracking.max_ungraded_steps=2")) == 2
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in "".join(lines), lines
    assert lines[0].startswith("wmrl: warning: step 1: all 16 anchor rollouts came back ungraded")
    assert lines[1] == (
        "wmrl: error: step 2: all 16 anchor rollouts came back ungraded (exec/ungraded = exec/step; "
        "first error: task toy: the baseline failed here (exit status 1)), 2 steps in a row: real "
        "execution is failing, not the policy (likely a task whose baseline fails here, or a broken "
        f"sandbox or executor); checkpoint of step 2 saved in {out}: fix the cause, then `wmrl run "
        f"--resume {out}` (--tracking.max_ungraded_steps=0 trains on regardless)"
    )
    assert torch.load(out / CHECKPOINT, weights_only=True)["step"] == 2
    assert [r["exec/ungraded"] for r in read_metrics(out)] == [16.0, 16.0]
    assert not (out / "summary.json").exists()


def test_max_ungraded_steps_0_trains_on_with_a_warning_per_step(tmp_path, capfd):
    preset = tmp_path / "broken.yaml"
    preset.write_text("domain: {type: toy_broken_env}\nmethod: wmrl\n")
    capfd.readouterr()
    argv = _args(str(preset), tmp_path / "run", "--tracking.max_ungraded_steps=0", "--grpo.steps=3")
    assert main(argv) == 0
    warnings = capfd.readouterr().err.strip().splitlines()
    assert len(warnings) == 3 and all("came back ungraded" in w for w in warnings)


@DomainConfig.register_subclass("toy_interrupted_build")
@dataclass
class InterruptedBuildToyConfig(ToyConfig):
    """The toy domain whose build is interrupted by Ctrl-C the first time (as a user stopping a
    minute-long sandbox start or SFT), then builds normally."""

    def build(self, run):
        marker = Path(run.out_dir).parent / "interrupted-once"
        if not marker.exists():
            marker.write_text("")
            os.kill(os.getpid(), signal.SIGINT)  # the default handler: KeyboardInterrupt here
        return super().build(run)


def test_ctrl_c_while_the_domain_builds_is_one_line_and_the_folder_resumes_from_step_0(tmp_path, capfd):
    preset = tmp_path / "p.yaml"
    preset.write_text("domain: {type: toy_interrupted_build}\nmethod: wmrl\n")
    run = tmp_path / "run"
    capfd.readouterr()
    assert main(_args(str(preset), run)) == 130
    err = capfd.readouterr().err
    assert err.strip().splitlines() == [
        f"wmrl: stopped by SIGINT outside a training step; `wmrl run --resume {run}` continues from "
        "the last checkpoint (from step 0 where none was saved)"
    ]
    assert (run / "config.yaml").exists() and not (run / CHECKPOINT).exists()
    assert main(["run", "--resume", str(run)]) == 0
    assert [r["step"] for r in read_metrics(run)] == list(range(1, STEPS + 1))
