"""Comparison grids: domain preset x method x seed, run on local processes or a Ray cluster, one report.

A grid is declared by a spec (a YAML file parsed into :class:`GridSpec`, wmrl/grid_spec.py, every
field overridable on the command line as ``--executor.type=ray --seeds=[0,1]``; its ``executor:`` is
the runs' own ExecutorConfig). ``wmrl compare SPEC --out-dir DIR``:

1. plans the cells and checks every one before anything runs (an unknown preset or method, or a
   cell whose saved config differs from what the spec now asks, is refused, naming the fields);
2. *prepares* each domain once per seed (its cached SFT / execution log / WM pretraining, so the
   cells that share them do not build them at the same time) and evaluates the starting policy on
   the held-out split (``DIR/<domain>/start-seed<k>.json``);
3. trains every unfinished cell (an ordinary run directory ``DIR/<domain>/<method>/seed<k>``: a
   finished one is kept, a killed one resumes from its checkpoint; a fresh one whose starting
   policy is not the one its seed's other cells recorded, ``start_policy.json``, is refused before
   its first step, so that every method of a seed starts from one policy), then re-evaluates its final
   policy on ``reeval_episodes`` held-out episodes or samples per task (``reeval.json`` in the run
   directory, kept while the run and the re-evaluation settings are unchanged; where those settings
   are the run's own, its final in-run evaluation is reused, not repeated);
4. writes ``report.md``, ``report.html`` and ``report.json`` (wmrl/report/), whose evidence
   table holds every WM method to the evidence standard (docs/design.md section 7): its paired
   difference to ``anchors_only`` with a one-sided 95% lower bound, a non-inferiority verdict at the
   domain's margin, and whether it clears its controls.

**Controls.** With ``control: true`` (the default) a grid that runs a WM method also runs
``anchors_only`` (the same real executions, no WM) and, beside each WM method ``m``,
``m_placebo`` (``m``'s own code path on the placebo WM: its scores permuted within each group,
``--wm_placebo=true``, wmrl/controls.py) and, beside ``ppi``, ``ppi_lambda0`` (ppi's own code path
with λ fixed at 0, ``--ppi.lam=0``: the WM's correction switched off). Control labels may also be
listed in ``methods`` by name.

**Seeds fixed before the grid runs.** Before any cell runs, ``DIR/ledger.json`` records for every
new cell when it was planned and which seeds already had finished cells then. A cell of a method
planned after its seed's results existed (a method added to a grid after seeing some seeds), or of
a seed listed in the spec's ``seen_seeds`` (a variant chosen after seeing those seeds of another
grid), is *exploratory*: the evidence table leaves it out and names it; the method's figure there
rests on the fresh seeds alone.

``DIR`` also holds ``spec.yaml`` (the spec as last run) and ``index.json`` (every cell, its run
directory and status). Stages 2 and 3 run as tasks on the executor: local worker processes
(``concurrent.futures`` with spawned processes), Ray tasks with declared CPUs and GPUs (the run
directories must lie on a path every node shares), or inline in this process.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import draccus

from wmrl.checkpoints import config_diff
from wmrl.config import ConfigError, ExecutorConfig, did_you_mean, load_config, presets
from wmrl.domain import check_domain, check_domain_config
from wmrl.grid_spec import (
    LEDGER,
    START,
    Cell,
    DomainEntry,
    GridSpec,
    base_method,
    cell_status,
    domain_margin,
    grid_controls,
    load_spec,
    read_cached,
    read_json,
    reeval_current,
)
from wmrl.runs import comparison_runs, config_diffs, result_fields, writable_dir
from wmrl.tracking import (
    CHECKPOINT,
    START_POLICY,
    RunDirError,
    exclusive,
    policy_fingerprint,
    read_metrics,
)

__all__ = ["Cell", "DomainEntry", "GridSpec", "load_spec", "plan", "run_grid"]

log = logging.getLogger("wmrl")


def plan(spec: GridSpec, out: Path) -> list[Cell]:
    """Every cell of the grid, each config loaded once here so that a bad preset or override fails
    before anything runs (naming its domain)."""
    out = out.resolve()
    cells: list[Cell] = []
    controls = grid_controls()
    for d in spec.domains:
        _check_preset(d)
        for method in spec.all_methods:
            for seed in spec.seeds_of(method):
                run_dir = out / d.name / method / f"seed{seed}"
                over = [
                    *d.overrides,
                    f"--method={base_method(method)}",
                    *(controls[method][1] if method in controls else []),
                    f"--seed={seed}",
                    f"--out_dir={run_dir}",
                ]
                try:
                    cfg = load_config(d.preset, over)
                except ConfigError as e:
                    raise ConfigError(
                        f"domain {d.name!r} (preset {d.preset}), {method} seed {seed}: {e}"
                    ) from None
                if not any(c.domain == d.name for c in cells):
                    domain_margin(d, cfg)  # a domain without a margin fails before anything runs
                n = d.reeval_episodes or spec.reeval_episodes
                size = type(cfg.domain).HELDOUT_SIZE
                reeval = [*d.reeval_overrides, *([f"--domain.{size}={n}"] if n and size else [])]
                cells.append(
                    Cell(
                        d.name,
                        method,
                        seed,
                        d.preset,
                        over,
                        reeval,
                        str(run_dir),
                        str(out / d.name / f"start-seed{seed}.json"),
                        d.start_sha1,
                    )  # fmt: skip
                )
    return cells


def _check_preset(d: DomainEntry) -> None:
    if Path(d.preset).suffix in (".yaml", ".yml"):
        if not Path(d.preset).is_file():
            raise ConfigError(f"domain {d.name!r}: preset file {d.preset!r} does not exist")
        return
    known = presets()
    if d.preset not in known:
        raise ConfigError(
            f"domain {d.name!r}: unknown preset {d.preset!r}{did_you_mean(d.preset, known)} "
            f"(known presets: {', '.join(known)})"
        )


def check_grid_dir(out: Path, cells: list[Cell]) -> None:
    """Refuse a directory that holds a single run or an older ``wmrl run`` comparison, and any cell whose
    saved config differs from the one the spec now asks for (naming the cell and the fields)."""
    if (out / "metrics.jsonl").exists() or (out / CHECKPOINT).exists():
        raise RunDirError(f"{out} holds a single run, not a grid; choose another --out-dir")
    if (out / "summary.json").exists() and comparison_runs(out):
        raise RunDirError(f"{out} holds a `wmrl run` comparison, not a grid; choose another --out-dir")
    problems = []
    for c in cells:
        saved = Path(c.run_dir) / "config.yaml"
        if saved.exists():
            diffs = config_diffs(saved, load_config(c.preset, c.overrides))
            if diffs:
                problems.append(f"{c.name}: {'; '.join(diffs[:4])}{'; ...' if len(diffs) > 4 else ''}")
    if problems:
        raise RunDirError(
            f"{out}: {len(problems)} cell(s) were run with a different config ({' | '.join(problems[:4])}"
            f"{' | ...' if len(problems) > 4 else ''}): choose another --out-dir, or restore the spec "
            "to finish the grid as it was started"
        )


def update_ledger(out: Path, cells: list[Cell]) -> dict:
    """Enter every cell not yet in ``DIR/ledger.json``, before any cell runs: a pending cell with
    the time it is planned (now, UTC) and the seeds that already have a finished cell in the grid
    (``seen_seeds``: results that could have informed the choice of its method); a cell that ran
    before the ledger existed with ``planned_at: null`` (unknown). Entries are never rewritten.
    Returns the ledger."""
    from datetime import UTC, datetime

    ledger = read_json(out / LEDGER) or {}
    entries = ledger.setdefault("cells", {})
    status = {c.name: cell_status(c) for c in cells}
    seen = sorted({c.seed for c in cells if status[c.name] in ("finished", "trained")})
    now = datetime.now(UTC).isoformat(timespec="seconds")
    for c in cells:
        if c.name not in entries:
            fresh = status[c.name] == "pending"
            entries[c.name] = {"planned_at": now if fresh else None, "seen_seeds": seen if fresh else None}
    _write_json(out / LEDGER, ledger)
    return ledger


# ---- the work each task does (runs in a worker process, a Ray worker or inline) ------------------


def prepare_domain(cells: list[Cell], cwd: str) -> dict:
    """Build the domain of ``cells`` (one domain) once per seed, so that its caches exist before the
    cells run concurrently, and evaluate each seed's starting policy on the held-out split."""
    _enter(cwd)
    t0 = time.perf_counter()
    done = set()
    for c in cells:
        if c.seed in done:
            continue
        done.add(c.seed)
        path = Path(c.start_path)
        if read_cached(path, c.reeval_overrides) is not None and all(
            cell_status(o) in ("finished", "trained") for o in cells if o.seed == c.seed
        ):
            continue
        with tempfile.TemporaryDirectory(prefix="wmrl-prepare-") as tmp:
            cfg = load_config(c.preset, [*c.overrides, f"--out_dir={tmp}"])
            domain = cfg.domain.build(cfg)  # the training build: its caches
            try:
                record_grid_start(c, policy_fingerprint(domain.policy), cfg)
            finally:
                _close(domain)
        if read_cached(path, c.reeval_overrides) is None:
            scores = _evaluate(c, checkpoint=None)
            _write_json(path, {"reeval_overrides": c.reeval_overrides, **scores})
    return {"domain": cells[0].domain, "seconds": time.perf_counter() - t0}


def run_cell(c: Cell, cwd: str) -> dict:
    """Train the cell (fresh, resumed from its checkpoint, or kept when finished), then re-evaluate
    its final policy on the held-out split (kept while current). Returns its status and seconds."""
    from wmrl.runs import train_run

    _enter(cwd)
    t0 = time.perf_counter()
    run_dir = Path(c.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with exclusive(run_dir):  # held through training (train_run takes it again) and re-evaluation
        if not (run_dir / "summary.json").exists():
            resume = (run_dir / CHECKPOINT).exists()
            if not resume and (run_dir / "metrics.jsonl").exists():
                _set_aside_metrics(run_dir)
            if not resume:  # a worker runs cells one after another: each starts from its seed alone
                _seed_globals(c.seed)
            train_run(load_config(c.preset, c.overrides), resume=resume, start_policy=seed_start(run_dir))
        if reeval_current(c) is None:
            scores = _final_inrun_eval(c) or _evaluate(c, checkpoint=run_dir / CHECKPOINT)
            _write_json(run_dir / "reeval.json", {"reeval_overrides": c.reeval_overrides, **scores})
    return {"cell": c.name, "status": "finished", "seconds": time.perf_counter() - t0}


def record_grid_start(c: Cell, sha1: str, cfg) -> None:
    """Check the start a preparation built against the domain's pinned start (``c.start_sha1``) and
    the grid's recorded one (``DIR/<domain>/start.json``), then record it there if it is the first.
    One start per grid: every seed of a domain, on any machine, starts from one policy; a domain
    whose start depends on the run seed (``START_PER_SEED``) records and checks one per seed."""
    cache = getattr(cfg.domain, "cache_dir", None)
    copy = (
        f"copy the domain's cache_dir ({cache}) from the machine that built it" if cache else "build it once"
    )
    per_seed = check_domain_config(cfg.domain).start_per_seed
    if c.start_sha1 and per_seed:
        raise ConfigError(
            f"domain {c.domain}: start_sha1 pins one start for every seed, but this domain builds its "
            "start from the run seed (START_PER_SEED): each seed has its own; remove start_sha1"
        )
    if c.start_sha1 and sha1 != c.start_sha1:
        raise RunDirError(
            f"domain {c.domain}: this machine's start is policy {sha1[:12]}, but the spec pins "
            f"start_sha1 {c.start_sha1[:12]}: {copy} before the grid prepares, so that its start is loaded, "
            "not rebuilt (floating-point sums differ between CPUs)"
        )
    path = c.grid_start_path
    record = read_json(path) or {}
    entry = {"policy_sha1": sha1, "cache_dir": cache, "host": platform.node(),
             "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
    if per_seed:
        seeds = record.get("per_seed", {})
        recorded = seeds.get(str(c.seed), {}).get("policy_sha1")
        if recorded and recorded != sha1:
            raise RunDirError(
                f"domain {c.domain} seed {c.seed}: this preparation built policy {sha1[:12]}, but {path} "
                f"records {recorded[:12]} for this seed, the start of its finished cells: {copy}"
            )
        if not recorded:
            _write_json(path, {"per_seed": {**seeds, str(c.seed): entry}})
        return
    recorded = record.get("policy_sha1")
    if recorded and recorded != sha1:
        raise RunDirError(
            f"domain {c.domain}: this preparation built policy {sha1[:12]}, but {path} records "
            f"{recorded[:12]}, the start of the grid's other seeds: {copy}"
        )
    if not recorded:
        _write_json(path, entry)


def seed_start(run_dir: Path) -> tuple[str, str] | None:
    """The start this cell must begin from, and where it was recorded: the one another cell of its
    seed recorded (``<domain>/<method>/seed<k>/start_policy.json``), else the grid's
    (``<domain>/start.json``, which the preparation checked the build against: its seed's entry
    where the domain records a start per seed), or None."""
    for other in sorted(run_dir.parent.parent.glob(f"*/{run_dir.name}/{START_POLICY}")):
        if other.parent != run_dir and (sha1 := (read_json(other) or {}).get("policy_sha1")):
            return sha1, str(other.parent)
    grid_start = run_dir.parent.parent / START
    record = read_json(grid_start) or {}
    if "per_seed" in record:
        record = record["per_seed"].get(run_dir.name.removeprefix("seed"), {})
    if sha1 := record.get("policy_sha1"):
        return sha1, str(grid_start)
    return None


def _final_inrun_eval(c: Cell) -> dict | None:
    """The run's own evaluation at its last step, when the re-evaluation would repeat it: the
    re-evaluation overrides change no result-relevant config field (e.g. the held-out size is the
    run's own) and the last metrics row holds an evaluation. Marked ``reused`` in ``reeval.json``."""
    run_cfg = result_fields(load_config(c.preset, c.overrides))
    reeval_cfg = result_fields(load_config(c.preset, [*c.overrides, *c.reeval_overrides]))
    rows = read_metrics(c.run_dir)
    if config_diff(run_cfg, reeval_cfg) or not rows:
        return None
    scores = {k.removeprefix("eval/"): float(v) for k, v in rows[-1].items() if k.startswith("eval/")}
    if not scores:
        return None
    return {"step": int(rows[-1]["step"]), "seconds": 0.0, "reused": "metrics.jsonl", "eval": scores}


def _enter(cwd: str) -> None:
    """Presets name caches relative to the directory the grid started in; a worker works there."""
    if os.path.isdir(cwd) and os.getcwd() != cwd:
        os.chdir(cwd)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _seed_globals(seed: int) -> None:
    """Seed the process-wide generators (torch, numpy, random) so that a cell's results do not
    depend on which cells its worker ran before (a resumed run restores them from its checkpoint)."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _set_aside_metrics(run_dir: Path) -> None:
    """A cell killed before its first checkpoint: its metric rows move to ``metrics.orphaned.jsonl``
    (nothing written is deleted) and the cell starts afresh."""
    rows = (run_dir / "metrics.jsonl").read_text()
    with open(run_dir / "metrics.orphaned.jsonl", "a") as f:
        f.write(rows)
    (run_dir / "metrics.jsonl").unlink()
    log.warning(
        "%s: killed before its first checkpoint; its metrics moved to metrics.orphaned.jsonl", run_dir
    )


def _evaluate(c: Cell, checkpoint: Path | None) -> dict:
    """The held-out evaluation (``Domain.evaluate("eval")``) of the cell's starting policy
    (``checkpoint=None``) or of the policy saved in ``checkpoint``, with the re-evaluation overrides.
    The domain is built in a scratch directory (whatever its evaluation writes is dropped)."""
    import torch

    from wmrl.tracking import safe_load

    with tempfile.TemporaryDirectory(prefix="wmrl-reeval-") as tmp:
        cfg = load_config(c.preset, [*c.overrides, *c.reeval_overrides, f"--out_dir={tmp}"])
        _seed_globals(cfg.seed)
        domain = cfg.domain.build(cfg)
        step = 0
        if checkpoint is not None:
            state = safe_load(checkpoint)
            domain.policy.load_state_dict(state["policy"])
            step = int(state["step"])
        domain.policy.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            scores = {k: float(v) for k, v in domain.evaluate("eval").items()}
        seconds = time.perf_counter() - t0
        _close(domain)
    return {"step": step, "seconds": seconds, "eval": scores}


def _close(domain) -> None:
    check_domain(domain).close_domain()


def _write_json(path: Path, data: dict) -> None:
    """Atomically (a killed write leaves no half file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


# ---- executors -----------------------------------------------------------------------------------


def run_tasks(
    fn: Callable, args: list[tuple], ex: ExecutorConfig
) -> Iterator[tuple[tuple, dict | BaseException]]:
    """``fn(*a)`` for every ``a`` of ``args`` on the executor; yields ``(a, result or exception)``
    as each finishes. A task's failure does not stop the others."""
    if not args:
        return
    if ex.type == "inline":
        for a in args:
            try:
                yield a, fn(*a)
            except Exception as e:  # noqa: BLE001 - reported with the cell's name
                yield a, e
    elif ex.type == "process":
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        ctx = multiprocessing.get_context("spawn")
        workers = min(ex.workers, len(args))
        with ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_die_with_parent, initargs=(os.getpid(),)
        ) as pool:
            futures = {pool.submit(fn, *a): a for a in args}
            for f in as_completed(futures):
                try:
                    yield futures[f], f.result()
                except Exception as e:  # noqa: BLE001
                    yield futures[f], e
    else:
        yield from _run_ray(fn, args, ex)


def _die_with_parent(parent_pid: int) -> None:
    """Worker initializer: the kernel terminates this worker when the grid's process dies (killed
    or terminated), so a stopped grid leaves no cell training on (Linux; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the grid died before the line above
        os._exit(1)


def _run_ray(fn: Callable, args: list[tuple], ex: ExecutorConfig):
    import ray

    from wmrl.executors import ExecutorError, _check_reachable, _start_local_ray

    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=True, configure_logging=False)
        try:
            if ex.ray_address is None:
                _start_local_ray(ray, num_cpus=max(ex.workers, int(ex.num_cpus) or 1), **kwargs)
            else:
                _check_reachable(ex.ray_address)
                ray.init(address=ex.ray_address, **kwargs)
        except (Exception, SystemExit) as e:  # ray.init calls sys.exit when it gives up on a cluster
            raise ExecutorError(
                f"could not start or reach a Ray cluster at address={ex.ray_address!r}: {e}"
            ) from e
        started = True
    try:
        remote = ray.remote(num_cpus=ex.num_cpus, num_gpus=ex.num_gpus, max_retries=0)(fn)
        refs = {remote.remote(*a): a for a in args}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    yield refs[ref], ray.get(ref)
                except Exception as e:  # noqa: BLE001
                    yield refs[ref], e
    finally:
        if started:
            ray.shutdown()


# ---- the grid ------------------------------------------------------------------------------------


def run_grid(
    spec: GridSpec, out: str | Path, echo: Callable[[str], None] = print, command: str | None = None
) -> dict:
    """Run (or finish) the grid of ``spec`` in ``out`` and write its report; returns the report."""
    out = Path(out)
    cells = plan(spec, out)
    if out.exists():
        check_grid_dir(out, cells)
    writable_dir(out)
    out = out.resolve()
    with exclusive(out):  # a second `wmrl compare` on this directory stops here, naming this one
        return _run_grid_locked(spec, out, cells, echo, command)


def _run_grid_locked(
    spec: GridSpec, out: Path, cells: list[Cell], echo: Callable[[str], None], command: str | None
) -> dict:
    from wmrl.report import write_report

    with open(out / "spec.yaml", "w") as f:
        draccus.dump(spec, f)
    cwd = os.getcwd()
    todo = [c for c in cells if cell_status(c) != "finished"]
    update_ledger(out, cells)  # the seeds and methods as fixed before anything below runs
    unprepared = {c.domain for c in cells if read_cached(Path(c.start_path), c.reeval_overrides) is None}
    _write_index(out, cells)
    echo(f"grid {out}: {len(cells)} cells, {len(cells) - len(todo)} finished, {len(todo)} to run "
         f"on {_describe(spec.executor)}")  # fmt: skip
    failures: list[str] = []
    t0 = time.perf_counter()
    if todo or unprepared:
        by_domain: dict[str, list[Cell]] = {}
        for c in cells:
            by_domain.setdefault(c.domain, []).append(c)
        need = {c.domain for c in todo} | unprepared
        prep = [(by_domain[d], cwd) for d in by_domain if d in need]
        failed_domains = set()
        for (dcells, _), res in run_tasks(prepare_domain, prep, spec.executor):
            if isinstance(res, BaseException):
                failed_domains.add(dcells[0].domain)
                failures.append(f"prepare {dcells[0].domain}: {_brief(res)}")
            else:
                echo(f"  prepared {res['domain']} ({res['seconds']:.0f} s)")
        jobs = [(c, cwd) for c in todo if c.domain not in failed_domains]
        for (c, _), res in run_tasks(run_cell, jobs, spec.executor):
            if isinstance(res, BaseException):
                failures.append(f"{c.name}: {_brief(res)}")
                echo(f"  {c.name}: FAILED ({_brief(res)})")
            else:
                echo(f"  {c.name}: finished ({res['seconds']:.0f} s)")
            _write_index(out, cells)
    wall = time.perf_counter() - t0
    _write_index(out, cells)
    report = write_report(out, spec, cells, grid_wall_s=wall if todo or unprepared else None, command=command)
    echo(f"report: {out}/report.md  {out}/report.html  {out}/report.json")
    if failures:
        raise RuntimeError(
            f"{len(failures)} task(s) of the grid failed (rerun to retry them): " + " | ".join(failures)
        )
    return report


def _describe(ex: ExecutorConfig) -> str:
    if ex.type == "process":
        return f"{ex.workers} local worker process(es)"
    if ex.type == "ray":
        return f"Ray ({ex.ray_address or 'local cluster'}; {ex.num_cpus:g} CPU, {ex.num_gpus:g} GPU per cell)"
    return "this process"


def _brief(e: BaseException) -> str:
    """A cell's failure in one line: a ConfigError's or RunDirError's message as it is (it names the
    field and the fix), anything else (a bug) after its class name."""
    text = str(e).strip().splitlines()[-1] if str(e).strip() else ""
    return (text if isinstance(e, ConfigError | RunDirError) else f"{type(e).__name__}: {text}")[:300]


def _write_index(out: Path, cells: list[Cell]) -> None:
    index = [
        {"domain": c.domain, "method": c.method, "seed": c.seed, "preset": c.preset,
         "run_dir": os.path.relpath(c.run_dir, out), "status": cell_status(c)}
        for c in cells
    ]  # fmt: skip
    _write_json(out / "index.json", {"cells": index})
