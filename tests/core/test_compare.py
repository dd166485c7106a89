"""`wmrl compare`: a grid of toy runs (domain x method x seed), its report, finishing a killed grid,
refusing a changed config, Ray against local processes, and clear errors for bad specs."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from wmrl.cli import main
from wmrl.config import ConfigError, load_config
from wmrl.report import ABSENT, TIME_KEYS, cell_figures, fmt_cell, mean_se
from wmrl.tracking import policy_fingerprint, read_metrics, safe_load

TINY = [
    "--domain.n_contexts=8",
    "--domain.n_actions=4",
    "--grpo.tasks_per_step=4",
    "--grpo.group_size=4",
    "--anchors.fraction=0.5",
    "--tracking.checkpoint_every=2",
]


def write_spec(
    path: Path, steps: int = 4, executor: str = "inline", extra: tuple = (), workers: int = 1
) -> Path:
    over = json.dumps([*TINY, f"--grpo.steps={steps}", *extra])
    path.write_text(
        "methods: [real, ppi]\nseeds: [0, 1]\n"
        f"domains:\n  - {{name: toy, preset: toy, overrides: {over}}}\n"
        f"executor: {{type: {executor}, workers: {workers}}}\n"
    )
    return path


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """A finished grid: toy x (real, anchors_only, ppi) x seeds 0, 1, in 2 local worker processes."""
    root = tmp_path_factory.mktemp("grid")
    spec = write_spec(root / "spec.yaml", executor="process", workers=2)
    assert main(["compare", str(spec), "--out-dir", str(root / "g")]) == 0
    return spec, root / "g"


def test_grid_writes_runs_index_and_report(grid):
    _, out = grid
    index = json.loads((out / "index.json").read_text())["cells"]
    assert [(c["method"], c["seed"]) for c in index] == [
        (m, s) for m in ("real", "anchors_only", "ppi", "ppi_placebo", "ppi_lambda0") for s in (0, 1)
    ]
    assert all(c["status"] == "finished" for c in index)
    for c in index:  # each cell is an ordinary run directory, plus its held-out re-evaluation
        run = out / c["run_dir"]
        assert (run / "config.yaml").exists() and (run / "summary.json").exists()
        assert json.loads((run / "reeval.json").read_text())["step"] == 4
    report = json.loads((out / "report.json").read_text())
    toy = report["domains"]["toy"]["methods"]
    real, ppi = toy["real"]["figures"], toy["ppi"]["figures"]
    # real executes every group (4 tasks x 4 rollouts x 4 steps), ppi and anchors_only half of them
    assert real["real_executions"]["mean"] == 64 and ppi["real_executions"]["mean"] == 32
    assert real["share_of_real_gain"]["mean"] == pytest.approx(1.0)
    final = [toy["ppi"]["per_seed"][s]["heldout_final"] for s in ("0", "1")]
    start = [toy["ppi"]["per_seed"][s]["heldout_start"] for s in ("0", "1")]
    assert ppi["gain"]["mean"] == pytest.approx(sum(f - s for f, s in zip(final, start, strict=True)) / 2)
    assert ppi["diff_vs_real"]["n"] == 2 and real["diff_vs_real"] is None
    # absent, not zero: the toy has no simulator, `real` no WM, ppi no anchor weight w
    assert real["sim_steps"] is None and real["anchor_corr"] is None and ppi["w"] is None
    assert ppi["anchor_corr"] is not None and ppi["residual_before"] is not None
    md = (out / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| toy | real | 2/2"))
    assert row.split(" | ")[9] == ABSENT  # the sim steps column
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "<table>" in html
    # the evidence: ppi against anchors_only and its two controls, at the toy's margin
    ev = report["domains"]["toy"]["evidence"]
    assert set(ev) == {"ppi", "ppi_placebo", "ppi_lambda0"} and ev["ppi"]["margin"] == 0.005
    assert set(ev["ppi"]["vs_controls"]) == {"ppi_placebo", "ppi_lambda0"}
    diffs = [toy["ppi"]["per_seed"][s]["heldout_final"] - toy["anchors_only"]["per_seed"][s]["heldout_final"]
             for s in ("0", "1")]  # fmt: skip
    assert ev["ppi"]["vs_anchors_only"]["mean"] == pytest.approx(sum(diffs) / 2)
    assert "## Evidence against anchors_only" in md and "| toy | ppi | 0, 1 |" in md
    assert "| toy | ppi_placebo | 0, 1 |" in md and "Evidence against anchors_only" in html


def test_rerun_keeps_finished_cells_and_refuses_a_changed_config(grid, capsys, tmp_path):
    spec, out = grid
    metrics = out / "toy/ppi/seed1/metrics.jsonl"
    before = (metrics.stat().st_mtime_ns, metrics.read_bytes())
    assert main(["compare", str(spec), "--out-dir", str(out)]) == 0
    assert "10 finished, 0 to run" in capsys.readouterr().out
    assert (metrics.stat().st_mtime_ns, metrics.read_bytes()) == before
    changed = write_spec(tmp_path / "changed.yaml", extra=("--grpo.lr=1.0",))
    assert main(["compare", str(changed), "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "10 cell(s) were run with a different config" in err and "toy/real/seed0: grpo.lr" in err
    assert (metrics.stat().st_mtime_ns, metrics.read_bytes()) == before


def test_a_seed_added_on_the_command_line_runs_only_its_cells(grid, tmp_path, capsys):
    spec, out = grid
    copy = tmp_path / "g"
    shutil.copytree(out, copy)
    metrics = copy / "toy/real/seed0/metrics.jsonl"
    before = metrics.read_bytes(), metrics.stat().st_mtime_ns
    assert (
        main(["compare", str(spec), "--out-dir", str(copy), "--seeds=[0,1,2]", "--executor.type=inline"]) == 0
    )
    assert "15 cells, 10 finished, 5 to run" in capsys.readouterr().out
    assert (metrics.read_bytes(), metrics.stat().st_mtime_ns) == before
    report = json.loads((copy / "report.json").read_text())
    assert report["domains"]["toy"]["methods"]["ppi"]["figures"]["heldout_final"]["n"] == 3


def test_a_method_added_after_seeing_seeds_is_exploratory_on_them(grid, tmp_path, capsys):
    """The ledger fixes each cell's seed before it runs; wmrl, added once seeds 0 and 1 had
    results, rests on the fresh seed 2 alone; a spec's seen_seeds leave ppi's seed 0 out."""
    spec, out = grid
    copy = tmp_path / "g"
    shutil.copytree(out, copy)
    entry = json.loads((copy / "ledger.json").read_text())["cells"]["toy/ppi/seed0"]
    assert entry["planned_at"] and entry["seen_seeds"] == []
    args = ["compare", str(spec), "--out-dir", str(copy), "--seeds=[0,1,2]", "--executor.type=inline"]
    assert main([*args, "--methods=[real,ppi,wmrl]"]) == 0
    ledger = json.loads((copy / "ledger.json").read_text())["cells"]
    assert ledger["toy/ppi/seed0"] == entry and ledger["toy/wmrl/seed2"]["seen_seeds"] == [0, 1]
    report = json.loads((copy / "report.json").read_text())
    ev = report["domains"]["toy"]["evidence"]
    assert ev["wmrl"]["exploratory_seeds"] == [0, 1] and ev["wmrl"]["vs_anchors_only"]["seeds"] == [2]
    assert ev["ppi"]["exploratory_seeds"] == [] and ev["ppi"]["vs_anchors_only"]["seeds"] == [0, 1, 2]
    assert ev["wmrl_placebo"]["exploratory_seeds"] == []  # a control is no claim
    assert "| toy | wmrl | 2 (0, 1 exploratory, left out) |" in (copy / "report.md").read_text()
    assert main([*args, "--methods=[real,ppi,wmrl]", "--seen_seeds=[0]"]) == 0
    ev = json.loads((copy / "report.json").read_text())["domains"]["toy"]["evidence"]
    assert ev["ppi"]["exploratory_seeds"] == [0] and ev["ppi"]["vs_anchors_only"]["seeds"] == [1, 2]
    assert "seen before this variant was chosen: 0" in (copy / "report.md").read_text()


def test_reevaluation_reuses_the_runs_final_evaluation_only_when_its_settings_are_the_runs(grid, tmp_path):
    """Without re-evaluation overrides the final in-run evaluation is the re-evaluation (equal to a
    fresh evaluation of the saved policy); an override that changes the config forces a fresh one."""
    from wmrl.grid import _evaluate, load_spec, plan

    spec, out = grid
    for c in plan(load_spec(spec, []), out):
        reeval = json.loads((Path(c.run_dir) / "reeval.json").read_text())
        last = read_metrics(c.run_dir)[-1]
        assert reeval["reused"] == "metrics.jsonl" and reeval["step"] == last["step"] == 4
        assert reeval["eval"] == {
            k.removeprefix("eval/"): v for k, v in last.items() if k.startswith("eval/")
        }
        fresh = _evaluate(c, checkpoint=Path(c.run_dir) / "checkpoints/latest.pt")["eval"]
        assert fresh == pytest.approx(reeval["eval"], rel=1e-6, nan_ok=True)
    other = tmp_path / "other.yaml"
    other.write_text(
        spec.read_text().replace("preset: toy,", "preset: toy, reeval_overrides: [--domain.noise=0.5],")
    )
    assert (
        main(
            ["compare", str(other), "--out-dir", str(tmp_path / "g"), "--seeds=[0]", "--executor.type=inline"]
        )
        == 0
    )
    reeval = json.loads((tmp_path / "g/toy/ppi/seed0/reeval.json").read_text())
    assert "reused" not in reeval and reeval["reeval_overrides"] == ["--domain.noise=0.5"]


@pytest.mark.slow
def test_every_method_of_a_seed_starts_from_one_policy(grid, tmp_path, capsys):
    spec, out = grid
    cfg = load_config("toy", [*TINY, f"--out_dir={tmp_path / 'fresh'}"])
    built = policy_fingerprint(cfg.domain.build(cfg).policy)  # the toy starts every seed alike
    cells = [(m, s) for m in ("real", "anchors_only", "ppi", "ppi_placebo", "ppi_lambda0") for s in (0, 1)]
    for m, s in cells:
        assert json.loads((out / f"toy/{m}/seed{s}/start_policy.json").read_text())["policy_sha1"] == built
    assert json.loads((out / "report.json").read_text())["domains"]["toy"]["start_mismatch"] == {}
    # seed 1's other cells started elsewhere (a cache built on another machine): its ppi cell, run
    # again, is refused before its first step, naming both starts
    copy = tmp_path / "g"
    shutil.copytree(out, copy)
    (copy / "toy/start.json").unlink()  # a grid from before the grid-wide start was recorded
    shutil.rmtree(copy / "toy/ppi/seed1")
    for m, s in cells:
        if s == 1 and m != "ppi":
            (copy / f"toy/{m}/seed{s}/start_policy.json").write_text(json.dumps({"policy_sha1": "ab" * 20}))
    capsys.readouterr()
    assert main(["compare", str(spec), "--out-dir", str(copy), "--executor.type=inline"]) == 2
    text = capsys.readouterr().out
    assert (
        f"toy/ppi/seed1: FAILED ({copy}/toy/ppi/seed1 would start from policy {built[:12]}, not its " in text
    )
    assert "abababababab" in text and not (copy / "toy/ppi/seed1/checkpoints/latest.pt").exists()
    # finished cells that recorded different starts: the report names the seed and each cell's start
    other = tmp_path / "other"
    shutil.copytree(out, other)
    (other / "toy/start.json").unlink()
    (other / "toy/real/seed1/start_policy.json").write_text(json.dumps({"policy_sha1": "ab" * 20}))
    assert main(["compare", str(spec), "--out-dir", str(other)]) == 0
    report = json.loads((other / "report.json").read_text())["domains"]["toy"]
    starts = {m: built[:12] for m in ("anchors_only", "ppi", "ppi_placebo", "ppi_lambda0")}
    assert report["start_mismatch"] == {"1": starts | {"real": "abababababab"}}
    assert "**toy seed 1: its cells started from different policies**" in (other / "report.md").read_text()


def test_one_start_per_grid_recorded_pinned_and_refused_when_another(grid, tmp_path, capsys):
    """The first preparation records the domain's start (DIR/<domain>/start.json); a fresh cell of
    any seed whose start is another is refused before its first step, naming the file; a spec that
    pins `start_sha1` refuses a machine that builds another start before any cell trains; the
    report states the one start its seeds share."""
    spec, out = grid
    cfg = load_config("toy", [*TINY, f"--out_dir={tmp_path / 'fresh'}"])
    built = policy_fingerprint(cfg.domain.build(cfg).policy)
    assert json.loads((out / "toy/start.json").read_text())["policy_sha1"] == built
    report = json.loads((out / "report.json").read_text())["domains"]["toy"]
    assert report["starts"] == {built[:12]: [0, 1]}
    assert f"every seed starts from policy {built[:12]}" in (out / "report.md").read_text()
    # another machine's grid recorded another start: a fresh cell here is refused, naming it
    copy = tmp_path / "g"
    shutil.copytree(out, copy)
    (copy / "toy/start.json").write_text(json.dumps({"policy_sha1": "cd" * 20}))
    shutil.rmtree(copy / "toy/real/seed0")
    capsys.readouterr()
    assert main(["compare", str(spec), "--out-dir", str(copy), "--executor.type=inline"]) == 2
    text = "".join(capsys.readouterr())
    assert (
        f"this preparation built policy {built[:12]}, but {copy / 'toy/start.json'} records cdcdcdcdcdcd"
        in text
    )
    assert not (copy / "toy/real/seed0/checkpoints/latest.pt").exists()
    # a pinned start that this machine does not build: refused at preparation, before any cell
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(spec.read_text().replace("preset: toy,", f"preset: toy, start_sha1: {'ef' * 20},"))
    assert main(["compare", str(pinned), "--out-dir", str(tmp_path / "p"), "--executor.type=inline"]) == 2
    text = "".join(capsys.readouterr())
    assert f"this machine's start is policy {built[:12]}, but the spec pins start_sha1 efefefefefef" in text
    assert not list((tmp_path / "p").glob("toy/*/seed*/checkpoints"))
    pinned.write_text(spec.read_text().replace("preset: toy,", f"preset: toy, start_sha1: {built},"))
    shutil.copytree(out, tmp_path / "q")
    assert main(["compare", str(pinned), "--out-dir", str(tmp_path / "q")]) == 0


def test_killed_grid_finishes_only_what_is_missing(tmp_path, capsys):
    """Kill the grid's process once the first cell finished and the second is between checkpoints;
    the rerun keeps the first, resumes the second and runs the rest."""
    spec = write_spec(tmp_path / "spec.yaml", steps=20, extra=("--domain.exec_cost_s=0.005",))
    out = tmp_path / "g"
    cmd = [sys.executable, "-m", "wmrl.cli", "compare", str(spec), "--out-dir", str(out)]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first, second = out / "toy/real/seed0", out / "toy/real/seed1"
    deadline = time.monotonic() + 300
    try:
        while not ((first / "reeval.json").exists() and (second / "checkpoints/latest.pt").exists()):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the grid did not reach its second cell"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (second / "summary.json").exists()  # killed mid-run
    kept = (first / "metrics.jsonl").stat().st_mtime_ns, (first / "metrics.jsonl").read_bytes()
    killed_rows = read_metrics(second)  # a truncated last line left out
    ckpt = safe_load(second / "checkpoints/latest.pt")["step"]
    assert 0 < ckpt < 20
    assert main(["compare", str(spec), "--out-dir", str(out)]) == 0
    assert "1 finished, 9 to run" in capsys.readouterr().out
    assert ((first / "metrics.jsonl").stat().st_mtime_ns, (first / "metrics.jsonl").read_bytes()) == kept
    rows = [json.loads(line) for line in (second / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(0, 21))  # step 0: the first evaluation
    # resumed, not restarted: the rows up to the checkpoint are the ones the killed run wrote
    assert rows[: ckpt + 1] == [r for r in killed_rows if r["step"] <= ckpt]
    index = json.loads((out / "index.json").read_text())["cells"]
    assert all(c["status"] == "finished" for c in index)


@pytest.mark.slow
def test_a_terminated_grid_takes_its_worker_processes_down(tmp_path):
    """SIGTERM to the grid's process alone (not its process group): the worker processes training
    its cells exit too, instead of running on unowned."""
    spec = write_spec(
        tmp_path / "spec.yaml", steps=5000, executor="process", workers=2,
        extra=("--domain.exec_cost_s=0.005",),
    )  # fmt: skip
    out = tmp_path / "g"
    cmd = [sys.executable, "-m", "wmrl.cli", "compare", str(spec), "--out-dir", str(out)]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    try:
        cells = [out / "toy/real/seed0", out / "toy/real/seed1"]
        while not all((c / "checkpoints/latest.pt").exists() for c in cells):  # both workers train
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the grid did not start its cells"
            time.sleep(0.05)
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert len(workers) >= 2
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs(workers, timeout=30)
        assert alive == []
    finally:
        with contextlib.suppress(ProcessLookupError):  # nothing left of the group: as it should be
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (out / "toy/real/seed0/summary.json").exists()  # stopped mid-run, not finished


@pytest.mark.slow
def test_ray_on_a_local_cluster_gives_the_same_report_as_local_processes(grid, tmp_path, ray_cluster):
    """The cells as Ray tasks on the session's local cluster (started the way the grid starts one)."""
    spec, out = grid
    ray_args = ["--executor.type=ray", "--executor.workers=2"]
    assert main(["compare", str(spec), "--out-dir", str(tmp_path / "ray"), *ray_args]) == 0
    local, ray = (json.loads((d / "report.json").read_text()) for d in (out, tmp_path / "ray"))
    assert _figures(ray) == _figures(local)
    assert ray["domains"]["toy"]["methods"]["ppi"]["figures"]["heldout_final"] is not None


def _figures(report: dict) -> dict:
    """Every per-seed figure but the timings."""
    return {
        (m, s): {k: v for k, v in fig.items() if k not in TIME_KEYS}
        for m, entry in report["domains"]["toy"]["methods"].items()
        for s, fig in entry["per_seed"].items()
    }


def test_absent_metrics_stay_absent():
    rows = [{"step": 1, "exec/real_total": 8.0, "denoise/s2": float("nan")}]
    fig = cell_figures(rows, "wmrl", "success", start=None, final=0.5)
    assert fig["real_executions"] == 8.0 and fig["gain"] is None and fig["s2"] is None
    assert fig["sim_steps"] is None and fig["time_update"] is None and fig["wall_clock_s"] is None
    assert mean_se([None, None]) is None and mean_se([1.0, None]) == {"mean": 1.0, "se": None, "n": 1}


def test_offline_data_counts_for_the_wm_methods_only():
    rows = [{"step": 1, "exec/real_total": 8.0}]
    offline = {"executions": 280, "sim_steps": 12345}
    fig = cell_figures(rows, "ppi", "success", start=None, final=0.5, offline=offline)
    assert (fig["offline_executions"], fig["offline_sim_steps"]) == (280.0, 12345.0)
    for method in ("anchors_only", "real"):  # they never read the WM, so its data is not their cost
        fig = cell_figures(rows, method, "success", start=None, final=0.5, offline=offline)
        assert fig["offline_executions"] is None and fig["offline_sim_steps"] is None
    research = cell_figures(rows, "wmrl", "score_mean", start=None, final=0.5, offline={"executions": 181})
    assert research["offline_executions"] == 181.0 and research["offline_sim_steps"] is None


def test_a_figure_over_fewer_seeds_than_its_row_says_how_many():
    """E.g. executions to `real`'s final: reached on 1 of 4 seeds must not read as a 4-seed mean."""
    reached = mean_se([48.0, None, None, None])
    assert fmt_cell(reached, seeds=4) == "48.00 (1 of 4)"
    assert fmt_cell(mean_se([48.0, 96.0]), seeds=2) == "72.00 ± 24.00"
    assert fmt_cell(mean_se([None, None]), seeds=2) == ABSENT


def test_the_cost_to_reach_reals_final_is_read_at_the_first_evaluation_that_reaches_it():
    """Executions and simulator steps at a method's first in-run evaluation >= `real`'s final
    (mean over seeds); none for a seed that never reaches it, and no sim steps without a simulator."""
    from wmrl.report import aggregate_domain

    def cell(method: str, sim_steps: float) -> dict:
        rows = [{"step": 60, "exec/real_total": 64.0, "domain/sim_steps": sim_steps}]
        fig = cell_figures(rows, method, "success", start=0.2, final=0.5)
        return fig | {"status": "finished", "final_inrun": 0.5, "exploratory": False}

    # (executions, wall-clock, score, sim steps); real's finals 0.6 and 0.4: the target is 0.5
    curves = {
        ("real", 0): [(0, 0, 0.2, 0), (64, 1, 0.6, 1000)],
        ("real", 1): [(0, 0, 0.2, 0), (64, 1, 0.4, 1100)],
        ("ppi", 0): [(0, 0, 0.2, 0), (16, 1, 0.45, 250), (32, 2, 0.55, 300), (48, 3, 0.7, 400)],
        ("ppi", 1): [(0, 0, 0.2, 0), (16, 1, 0.3, 200)],
    }
    per_cell = {key: cell(key[0], curve[-1][3]) for key, curve in curves.items()}
    per_cell[("real", 0)]["final_inrun"], per_cell[("real", 1)]["final_inrun"] = 0.6, 0.4
    out = aggregate_domain(per_cell, curves, ["real", "ppi"], [0, 1])
    ppi = out["methods"]["ppi"]
    assert ppi["per_seed"]["0"]["execs_to_real_final"] == 32.0
    assert ppi["per_seed"]["0"]["sim_steps_to_real_final"] == 300.0
    assert ppi["per_seed"]["1"]["sim_steps_to_real_final"] is None  # never reached
    assert ppi["figures"]["sim_steps_to_real_final"] == {"mean": 300.0, "se": None, "n": 1}
    assert out["methods"]["real"]["per_seed"]["0"]["sim_steps_to_real_final"] == 1000.0
    per_cell[("ppi", 0)]["sim_steps"] = None  # a domain without a simulator (research): no sim steps
    out = aggregate_domain(per_cell, curves, ["real", "ppi"], [0, 1])
    assert out["methods"]["ppi"]["per_seed"]["0"]["sim_steps_to_real_final"] is None
    assert out["methods"]["ppi"]["per_seed"]["0"]["execs_to_real_final"] == 32.0


def test_the_plot_gains_a_simulator_steps_panel_for_a_domain_with_a_simulator(tmp_path):
    from PIL import Image

    from wmrl.report import plot

    def domain(sim: float) -> dict:  # curves: (executions, wall-clock, score, simulator steps)
        curves = {"real/seed0": [[0, 0, 0.1, 0], [64, 10, 0.3, 64 * sim]]}
        return {"score": "success", "methods": {"real": {}}, "curves": curves}

    widths = {}
    for name, sims in (("toy", (0,)), ("both", (0, 50))):
        report = {"domains": {f"d{k}": domain(sim) for k, sim in enumerate(sims)}}
        widths[name] = Image.open(plot(report, tmp_path / f"{name}.png")).size
    assert widths["toy"] == (1100, 360) and widths["both"] == (1650, 720)  # 2 panels, then 3 per row


def test_the_wm_quality_the_runs_log_is_kept_per_step_and_plotted(grid):
    """ppi's runs log ppi/rho at every step: the report keeps it per cell and step (ppi and its controls,
    not real), draws report_wm.png and links it; a non-finite value is kept as absent."""
    from wmrl.report import wm_quality_curve

    _, out = grid
    report = json.loads((out / "report.json").read_text())
    wm = report["domains"]["toy"]["wm_curves"]
    assert {k.split("/seed")[0] for k in wm} >= {"ppi", "ppi_placebo"} and not any(
        k.startswith("real/") for k in wm
    )
    rows = read_metrics(out / "toy/ppi/seed0")
    assert [p[0] for p in wm["ppi/seed0"]] == [r["step"] for r in rows if "ppi/rho" in r]
    assert [p[2] for p in wm["ppi/seed0"]] == [r["ppi/rho"] for r in rows if "ppi/rho" in r]
    assert (out / "report_wm.png").stat().st_size > 0 and "(report_wm.png)" in (out / "report.md").read_text()
    assert wm_quality_curve([{"step": 3, "wm/success_auc": float("nan"), "wm/z2": 1.5}, {"step": 4}]) == [
        [3.0, None, None, 1.5]
    ]


def test_the_wm_quality_trend_is_a_centred_rolling_mean_shortened_at_the_ends():
    from wmrl.report import rolling_mean

    assert rolling_mean([1.0, 2.0, 3.0, 4.0, 10.0], 3) == pytest.approx([1.5, 2.0, 3.0, 17 / 3, 7.0])
    assert rolling_mean([5.0, 1.0], 9) == [3.0, 3.0] and rolling_mean([], 9) == []


def test_the_plot_names_the_offline_data_under_the_axes_it_would_add_to():
    from wmrl.report.plots import _offline_note

    figures = {"offline_executions": {"mean": 280.0}, "offline_sim_steps": {"mean": 12345.0}}
    dom = {"methods": {"real": {"figures": {"offline_executions": None}}, "ppi": {"figures": figures}}}
    notes = _offline_note(dom)
    assert "280 offline executions" in notes[0] and "12,345 offline sim steps" in notes[3]
    assert _offline_note({"methods": {"real": {"figures": {}}}}) == {}


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "methods: [real, magic]\ndomains: [{name: t, preset: toy}]\n",
            "methods entry 'magic' is not one of",
        ),
        ("methods: [real]\ndomains: [{name: t, preset: tyo}]\n", "unknown preset 'tyo'; did you mean 'toy'?"),
        ("methods: [real]\ndomains: [{name: t, preset: toy, overrides: [--grpo.stpes=3]}]\n", "grpo.stpes"),
        (
            "methods: [real]\ndomain: [{name: t, preset: toy}]\n",
            "unknown field 'domain'; did you mean 'domains'?",
        ),
        ("methods: [real\ndomains: []\n", "malformed YAML"),
        ("methods: [real]\ndomains: []\n", "domains is empty"),
        (
            "methods: [ppi_placebbo]\ndomains: [{name: t, preset: toy}]\n",
            "or a control (wm_placebo, mix_placebo, debias_placebo, denoise_placebo, wmrl_placebo, "
            "ppi_placebo, ppi_lambda0); did you mean 'ppi_placebo'?",
        ),
        ("methods: [ppi]\ndomains: [{name: t, preset: toy, margin: -0.01}]\n", "margin=-0.01 must be >= 0"),
    ],
)
def test_bad_specs_are_one_clear_error(tmp_path, capsys, text, message):
    (tmp_path / "s.yaml").write_text(text)
    assert main(["compare", str(tmp_path / "s.yaml"), "--out-dir", str(tmp_path / "g")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "g").exists()


def test_missing_spec_and_bad_executor(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    spec = write_spec(tmp_path / "s.yaml")
    assert main(["compare", str(spec), "--out-dir", str(tmp_path / "g"), "--executor.type=slurm"]) == 2
    assert "executor.type='slurm' is not one of process, ray, inline" in capsys.readouterr().err


@pytest.mark.parametrize("spec", sorted((Path(__file__).parents[2] / "benchmarks" / "specs").glob("*.yaml")))
def test_committed_specs_plan_every_cell(spec):
    """Every committed grid spec parses and plans (each cell's config loads), with its control."""
    from wmrl.grid import load_spec, plan

    s = load_spec(spec)
    cells = plan(s, Path("/nonexistent-grid"))
    assert len(cells) == len(s.domains) * sum(len(s.seeds_of(m)) for m in s.all_methods)
    if s.control and {"wmrl", "ppi"} & set(s.methods):
        assert "anchors_only" in {c.method for c in cells}


@pytest.mark.parametrize(
    "spec", sorted((Path(__file__).parents[2] / "benchmarks" / "specs" / "user_folders").glob("*.yaml"))
)
def test_specs_on_a_users_policy_folder_parse_and_name_the_missing_folder(spec, tmp_path, monkeypatch):
    """A spec that starts from a policy folder built by a command (benchmarks/specs/user_folders/)
    parses everywhere; without the folder, planning stops with one line naming it."""
    from wmrl.config import ConfigError
    from wmrl.grid import load_spec, plan

    s = load_spec(spec)
    folders = [
        o.split("=", 1)[1] for d in s.domains for o in d.overrides if o.startswith("--domain.policy_path=")
    ]
    monkeypatch.chdir(tmp_path)  # a checkout without the folders (a developer's may have built them)
    assert folders and not any(Path(f).exists() for f in folders)
    with pytest.raises(ConfigError, match=f"domain.policy_path={folders[0]} is neither a folder"):
        plan(s, Path("/nonexistent-grid"))


@pytest.mark.parametrize(
    "family", sorted((Path(__file__).parents[2] / "benchmarks" / "specs" / "families").glob("*.yaml"))
)
def test_committed_families_name_committed_grids_that_run_their_methods(family):
    """Every committed confirmatory family parses, and each of its grids' specs runs the family's
    methods and baseline on every seed it fixes."""
    from wmrl.family import load_family
    from wmrl.grid import load_spec

    fam = load_family(family)
    root = Path(__file__).parents[2]
    for g in fam.grids:
        s = load_spec(root / g.spec)
        for m in [*fam.methods, fam.baseline]:
            assert m in s.all_methods and s.seeds_of(m) == s.seeds, (g.spec, m)


def test_merged_parts_equal_the_whole_grid(grid, tmp_path, capsys):
    """The report of seeds 0 and 1 merged from two one-seed reports equals the grid's own report."""
    spec, out = grid
    parts = []
    for seed in (0, 1):  # the finished grid's report rewritten for one seed: the part a machine made
        part = tmp_path / f"part{seed}"
        shutil.copytree(out, part)
        assert main(["compare", str(spec), "--out-dir", str(part), f"--seeds=[{seed}]"]) == 0
        parts.append(part)
    assert (
        main(
            ["merge-reports", str(parts[0]), str(parts[1] / "report.json"), "--out-dir", str(tmp_path / "m")]
        )
        == 0
    )
    merged = json.loads((tmp_path / "m" / "report.json").read_text())
    whole = json.loads((out / "report.json").read_text())
    assert merged["spec"]["seeds"] == [0, 1] and [p["seeds"] for p in merged["merged_from"]] == [[0], [1]]
    for m, entry in whole["domains"]["toy"]["methods"].items():
        got = merged["domains"]["toy"]["methods"][m]
        assert got["per_seed"] == entry["per_seed"]
        for k, f in entry["figures"].items():
            assert got["figures"][k] == (pytest.approx(f) if f is not None else None), (m, k)
    assert merged["domains"]["toy"]["heldout_start"] == pytest.approx(
        whole["domains"]["toy"]["heldout_start"]
    )
    assert merged["domains"]["toy"]["evidence"] == whole["domains"]["toy"]["evidence"]
    assert (
        merged["seeds_fixed_at"] == whole["seeds_fixed_at"] and None not in whole["seeds_fixed_at"].values()
    )
    assert merged["domains"]["toy"]["wm_curves"] == whole["domains"]["toy"]["wm_curves"]
    md = (tmp_path / "m" / "report.md").read_text()
    assert "merged: seeds 0 from" in md and "| toy | ppi | 2/2 |" in md
    capsys.readouterr()
    # the same seed twice, or a part of another grid: one clear error, nothing written
    assert main(["merge-reports", str(parts[0]), str(out), "--out-dir", str(tmp_path / "x")]) == 2
    assert "seed 0 is in both" in capsys.readouterr().err
    other = json.loads((parts[1] / "report.json").read_text())
    other["spec"]["methods"] = [*other["spec"]["methods"], "wmrl"]
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert (
        main(["merge-reports", str(parts[0]), str(tmp_path / "other.json"), "--out-dir", str(tmp_path / "x")])
        == 2
    )
    assert "its methods ['wmrl'] are not among" in capsys.readouterr().err
    other["spec"]["control"] = not other["spec"]["control"]
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert (
        main(["merge-reports", str(parts[0]), str(tmp_path / "other.json"), "--out-dir", str(tmp_path / "x")])
        == 2
    )
    assert "its spec differs in control" in capsys.readouterr().err
    assert (
        main(
            ["merge-reports", str(parts[0]), str(tmp_path / "nothing.json"), "--out-dir", str(tmp_path / "x")]
        )
        == 2
    )
    assert "cannot read the report" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_method_from_another_grid_replaces_its_cells_and_pairs_with_the_parts(grid, tmp_path, capsys):
    """`--method-from ppi=G2`: ppi's cells come from a grid that ran it with other overrides (a
    higher learning rate) on the same preset; every other method stays the parts', and ppi's paired
    difference against anchors_only is recomputed seed by seed across the two grids."""
    spec, out = grid
    other = tmp_path / "spec2.yaml"
    over = json.dumps([*TINY, "--grpo.steps=4", "--grpo.lr=0.3"])
    other.write_text(
        "methods: [ppi]\nseeds: [0, 1]\ncontrol: false\n"
        f"domains:\n  - {{name: toy, preset: toy, overrides: {over}}}\nexecutor: {{type: inline}}\n"
    )
    assert main(["compare", str(other), "--out-dir", str(tmp_path / "g2")]) == 0
    args = ["merge-reports", str(out), "--method-from", f"ppi={tmp_path / 'g2'}", "--out-dir"]
    assert main([*args, str(tmp_path / "m")]) == 0
    merged = json.loads((tmp_path / "m" / "report.json").read_text())["domains"]["toy"]["methods"]
    whole = json.loads((out / "report.json").read_text())["domains"]["toy"]["methods"]
    theirs = json.loads((tmp_path / "g2" / "report.json").read_text())["domains"]["toy"]["methods"]
    finals = {m: [e["per_seed"][s]["heldout_final"] for s in ("0", "1")] for m, e in whole.items()}
    replaced = [theirs["ppi"]["per_seed"][s]["heldout_final"] for s in ("0", "1")]
    assert replaced != finals["ppi"]  # the override changed the runs: the test can tell the sources apart
    assert [merged["ppi"]["per_seed"][s]["heldout_final"] for s in ("0", "1")] == replaced
    for m in ("real", "anchors_only"):
        assert merged[m]["per_seed"] == whole[m]["per_seed"]
    diffs = [p - a for p, a in zip(replaced, finals["anchors_only"], strict=True)]
    assert merged["ppi"]["figures"]["diff_vs_anchors_only"] == pytest.approx(mean_se(diffs))
    md = (tmp_path / "m" / "report.md").read_text()
    assert "`ppi`: every cell from" in md and "--grpo.lr=0.3" in md
    capsys.readouterr()
    # bad input: one clear error, nothing written
    for given, message in (
        ("ppi", "--method-from takes METHOD=REPORT, got 'ppi'"),
        (f"wmrl={tmp_path / 'g2'}", "that report has no wmrl cells"),
        (f"ppi={tmp_path / 'none.json'}", "cannot read the report"),
    ):
        assert (
            main(["merge-reports", str(out), "--method-from", given, "--out-dir", str(tmp_path / "x")]) == 2
        )
        assert message in capsys.readouterr().err
    assert main(["merge-reports", str(out), "--out-dir", str(tmp_path / "x")]) == 2
    assert "merging needs at least two reports" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_part_with_fewer_methods_merges_and_its_missing_methods_count_fewer_seeds(grid, tmp_path):
    """Seed 1 run with `--methods=[real]` only (no WM method: no control): real over both seeds,
    ppi and anchors_only over seed 0 alone, equal to the whole grid's seed-0 figures."""
    spec, out = grid
    parts = []
    for seed, extra in ((0, []), (1, ["--methods=[real]"])):
        part = tmp_path / f"part{seed}"
        shutil.copytree(out, part)
        assert main(["compare", str(spec), "--out-dir", str(part), f"--seeds=[{seed}]", *extra]) == 0
        parts.append(part)
    assert main(["merge-reports", str(parts[0]), str(parts[1]), "--out-dir", str(tmp_path / "m")]) == 0
    merged = json.loads((tmp_path / "m" / "report.json").read_text())["domains"]["toy"]["methods"]
    whole = json.loads((out / "report.json").read_text())["domains"]["toy"]["methods"]
    assert merged["real"]["per_seed"] == whole["real"]["per_seed"]
    for m in ("ppi", "anchors_only"):
        assert merged[m]["per_seed"]["1"]["status"] == "not run"
        assert merged[m]["figures"]["heldout_final"]["n"] == 1
    assert merged["ppi"]["per_seed"]["0"] == whole["ppi"]["per_seed"]["0"]
    md = (tmp_path / "m" / "report.md").read_text()
    assert "| toy | real | 2/2 |" in md and "| toy | ppi | 1/2 |" in md


def test_the_report_reads_a_grid_without_the_grid_runner():
    """wmrl/report/ takes the grid's spec and cells from wmrl/grid_spec.py: importing it loads
    neither wmrl/grid.py (no grid <-> report circle) nor the run machinery."""
    code = "import sys, wmrl.report; print(sorted(m for m in sys.modules if m in ('wmrl.grid', 'wmrl.runs')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_a_control_planned_on_some_seeds_only_runs_and_is_reported_there(grid, tmp_path):
    """`method_seeds` (the controls on the first seeds of a long grid): the controls' cells are
    planned on seed 0 only; seed 1 reads "not planned" and the evidence pairs the controls over
    seed 0 alone, with the figures of the grid that ran them on both seeds."""
    from wmrl.grid import plan
    from wmrl.grid_spec import load_spec

    spec, out = grid
    part = tmp_path / "g"
    shutil.copytree(out, part)
    narrowed = tmp_path / "spec.yaml"
    narrowed.write_text(spec.read_text() + "method_seeds: {ppi_placebo: [0], ppi_lambda0: [0]}\n")
    cells = plan(load_spec(narrowed), part)
    assert sorted((c.method, c.seed) for c in cells if c.method.startswith("ppi_")) == [
        ("ppi_lambda0", 0),
        ("ppi_placebo", 0),
    ]
    assert len(cells) == 8
    assert main(["compare", str(narrowed), "--out-dir", str(part)]) == 0
    toy = json.loads((part / "report.json").read_text())["domains"]["toy"]
    whole = json.loads((out / "report.json").read_text())["domains"]["toy"]
    assert toy["methods"]["ppi_placebo"]["per_seed"]["1"]["status"] == "not planned"
    assert toy["methods"]["ppi_placebo"]["per_seed"]["0"] == whole["methods"]["ppi_placebo"]["per_seed"]["0"]
    assert toy["evidence"]["ppi"]["vs_controls"]["ppi_placebo"]["n"] == 1
    assert toy["evidence"]["ppi"]["vs_anchors_only"]["n"] == 2
    narrowed.write_text(spec.read_text() + "method_seeds: {ppi_plaecbo: [0]}\n")
    with pytest.raises(ConfigError, match="ppi_plaecbo.*did you mean 'ppi_placebo'"):
        load_spec(narrowed)
    # a part run of some methods keeps the others' seeds out; the file itself may not name them
    narrowed.write_text(spec.read_text() + "method_seeds: {real: [0], ppi_lambda0: [1]}\n")
    part_run = load_spec(narrowed, ["--methods=[real]"])
    assert part_run.all_methods == ["real"] and part_run.method_seeds == {"real": [0]}
    assert [(c.method, c.seed) for c in plan(part_run, tmp_path / "part")] == [("real", 0)]
    assert load_spec(narrowed, ["--control=false"]).method_seeds == {"real": [0]}
    narrowed.write_text(
        spec.read_text().replace("[real, ppi]", "[real, wmrl]") + "method_seeds: {ppi_lambda0: [1]}\n"
    )
    with pytest.raises(
        ConfigError, match=r"spec.yaml: method_seeds names 'ppi_lambda0', which the grid does not run"
    ):
        load_spec(narrowed)


def test_a_domain_with_a_start_per_seed_records_and_checks_one_per_seed(tmp_path, monkeypatch):
    """A domain whose start depends on the run seed (START_PER_SEED, e.g. research) records one
    start per seed in DIR/<domain>/start.json: two seeds with different starts are both kept (a
    grid-wide check would refuse the second), a rebuild of a seed that differs from its record is
    refused, a cell finds its own seed's start, and a spec cannot pin one start for every seed."""
    from wmrl.grid import record_grid_start, seed_start
    from wmrl.grid_spec import Cell
    from wmrl.toy import ToyConfig
    from wmrl.tracking import RunDirError

    monkeypatch.setattr(ToyConfig, "START_PER_SEED", True, raising=False)
    cfg = load_config("toy", TINY)
    grid_dir = tmp_path / "g"

    def cell(seed: int, pin: str = "") -> Cell:
        run = grid_dir / "toy" / "real" / f"seed{seed}"
        start = grid_dir / "toy" / f"start-seed{seed}.json"
        return Cell("toy", "real", seed, "toy", [], [], str(run), str(start), pin)

    record_grid_start(cell(0), "a0" * 20, cfg)
    record_grid_start(cell(1), "b1" * 20, cfg)  # another seed, another start: kept
    record_grid_start(cell(0), "a0" * 20, cfg)  # the same seed rebuilt alike: accepted
    seeds = json.loads((grid_dir / "toy/start.json").read_text())["per_seed"]
    assert {k: v["policy_sha1"] for k, v in seeds.items()} == {"0": "a0" * 20, "1": "b1" * 20}
    refused = f"toy seed 1: this preparation built policy {'cc' * 6}, but .* records {'b1' * 6} for this seed"
    with pytest.raises(RunDirError, match=refused):
        record_grid_start(cell(1), "cc" * 20, cfg)
    assert seed_start(grid_dir / "toy/real/seed1") == ("b1" * 20, str(grid_dir / "toy/start.json"))
    assert seed_start(grid_dir / "toy/real/seed2") is None
    with pytest.raises(ConfigError, match="start_sha1 pins one start for every seed, but this domain builds"):
        record_grid_start(cell(2, pin="a0" * 20), "a0" * 20, cfg)
    # the same calls on a domain with one start: the second seed's other start is refused
    monkeypatch.setattr(ToyConfig, "START_PER_SEED", False)
    grid_dir = tmp_path / "shared"
    record_grid_start(cell(0), "a0" * 20, cfg)
    with pytest.raises(RunDirError, match="the start of the grid's other seeds"):
        record_grid_start(cell(1), "b1" * 20, cfg)


def test_the_report_says_whether_seeds_share_a_start():
    """One start for every seed, a start of each seed's own (a START_PER_SEED domain), or seeds
    split between starts (a warning): the report's preamble says which."""
    from wmrl.report.render import _preamble

    def preamble(starts: dict) -> str:
        dom = {"preset": "p", "score": "s", "reeval_overrides": [], "heldout_start": None, "starts": starts}
        return "\n".join(_preamble({"spec": {"seeds": [0, 1, 2]}, "domains": {"d": dom}}))

    assert "every seed starts from policy aaa (SHA-1 of its weights)" in preamble({"aaa": [0, 1, 2]})
    own = preamble({"aaa": [0], "bbb": [1], "ccc": [2]})
    assert "each seed starts from its own policy (seed: SHA-1 of its weights; 0: aaa, 1: bbb, 2: ccc)" in own
    assert "**d: its seeds started from 2 policies** (aaa: seeds 0, 1; bbb: seeds 2)" in preamble(
        {"aaa": [0, 1], "bbb": [2]}
    )


def test_an_archive_keeps_the_finished_cells_without_checkpoints_and_compare_resumes_from_it(grid, tmp_path):
    """`wmrl archive`: the grid's reports, ledger and finished cells without checkpoints or locks; a
    cell whose re-evaluation is missing is left out, and so is a file over --max-mb. Copied back,
    `wmrl compare` keeps the archived cells as they are and trains the one left out."""
    from wmrl.grid_archive import archive_grid

    spec, out = grid
    part = tmp_path / "grid"
    shutil.copytree(out, part)
    (part / "toy" / "ppi" / "seed1" / "reeval.json").unlink()  # trained, not re-evaluated: not finished
    assert main(["archive", str(part), "--out-dir", str(tmp_path / "archive")]) == 0
    kept = {
        p.relative_to(tmp_path / "archive").as_posix()
        for p in (tmp_path / "archive").rglob("*")
        if p.is_file()
    }
    assert {"spec.yaml", "index.json", "ledger.json", "report.json"} <= kept
    assert not [
        k for k in kept if "checkpoints/" in k or k.endswith(".lock") or k.startswith("toy/ppi/seed1/")
    ]
    finished = [f"toy/{m}/seed{s}" for m in ("real", "anchors_only", "ppi", "ppi_placebo", "ppi_lambda0")
                for s in (0, 1) if (m, s) != ("ppi", 1)]  # fmt: skip
    assert all(f"{cell}/summary.json" in kept and f"{cell}/reeval.json" in kept for cell in finished)
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "archive", resumed)
    before = {c: (resumed / c / "metrics.jsonl").read_bytes() for c in finished}
    assert main(["compare", str(spec), "--out-dir", str(resumed)]) == 0
    assert {
        c: (resumed / c / "metrics.jsonl").read_bytes() for c in finished
    } == before  # kept, not retrained
    assert json.loads((resumed / "toy/ppi/seed1/reeval.json").read_text()) == json.loads(
        (out / "toy/ppi/seed1/reeval.json").read_text()
    )  # trained again from the start: the same run
    small = archive_grid(part, tmp_path / "small", max_bytes=200)
    assert any(e.startswith("report.json (") for e in small["left_out"])
    assert small["not_finished"] == {"toy/ppi/seed1": "trained"} and len(small["finished"]) == 9
    with pytest.raises(ConfigError, match="lies inside the grid"):
        archive_grid(part, part / "archive")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "spec.yaml").write_text("methods: [real]\n")
    with pytest.raises(ConfigError, match="holds another grid's archive"):
        archive_grid(part, tmp_path / "other")
