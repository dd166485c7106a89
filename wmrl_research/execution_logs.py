"""The research domain's pretraining execution logs, each cached as JSONL (:class:`ExecutionLog`):

- the SFT-sample log (:func:`build_execution_log`): the SFT policy's edits of each train task,
  executed in the sandbox, with each baseline;
- the random-edit log (:func:`build_random_log`): random points of each train task's knob space near
  its baseline (free mode: random free-form code edits, :mod:`wmrl_research.code_edits`), shared by
  every run with the same train tasks, size and seed.

The outcome world model pretrains on both (:mod:`wmrl_research.pipeline`).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from wmrl.tracking import say, stage
from wmrl_research.cache_keys import cache_key as _key
from wmrl_research.cache_keys import data_key as _data_key
from wmrl_research.code_edits import build_code_log, code_log_path
from wmrl_research.domain import ResearchDomain, to_example
from wmrl_research.edits import apply_edits, sample_knob_edit
from wmrl_research.tasks import FAILURE_SCORE
from world_models.outcome import ExecutionLog

if TYPE_CHECKING:
    from wmrl.config import RunConfig
    from wmrl_research.config import ResearchConfig
    from wmrl_research.policy import ResearchPolicy


def build_execution_log(
    cfg: ResearchConfig, run: RunConfig, policy: ResearchPolicy, train: list[Any], executor, path: Path
) -> ExecutionLog:
    """Sample ``log_samples_per_task`` edits per train task from the SFT policy, execute them all,
    and write them (with each baseline) to the JSONL log at ``path``. Rejected edits are not logged."""
    elog = ExecutionLog(path)
    if path.exists():
        return elog
    tmp = ExecutionLog(path.with_suffix(".partial"))
    tmp.path.unlink(missing_ok=True)
    domain = ResearchDomain(
        policy,
        None,  # type: ignore[arg-type]
        train,
        train,
        executor,
        cfg.edit_mode,
        cfg.sandbox_timeout_s,
        cfg.max_prompt_tokens,
        seed=run.seed,
        prompt_style=cfg.prompt_style,
    )
    gen = torch.Generator().manual_seed(run.seed + 11)
    t0 = time.perf_counter()
    progress = run.tracking.progress
    with stage(
        f"[research] execution log: sampling {cfg.log_samples_per_task} edits per train task", progress
    ):
        batch = domain.rollouts(train, cfg.log_samples_per_task, gen)
    rows = [i for i, p in enumerate(batch.payload) if p.applied]
    what = f"[research] execution log: executing {len(rows)} applied edits + {len(train)} baselines (sandbox start first)"
    with stage(what, progress):
        rewards = domain.execute(batch, rows)
    examples = [
        to_example(batch.tasks[i // cfg.log_samples_per_task], batch.payload[i].source, r, "log")
        for i, r in zip(rows, rewards.tolist(), strict=True)
        if r == r
    ]
    examples += [
        to_example(t, t.baseline_source, 0.0, "log", "ok") for t in train
    ]  # normalised baseline is 0
    tmp.append(examples)
    tmp.path.rename(path)
    say(f"[research] execution log: {len(examples)} records in {time.perf_counter() - t0:.1f}s", progress)
    return elog


RANDOM_LOG_MAX_CHANGES = 3


def random_edit_sources(
    task: Any, n: int, rng: random.Random, max_changes: int = RANDOM_LOG_MAX_CHANGES
) -> list[str]:
    """``n`` random points of ``task``'s knob space near its baseline: each sets 1..``max_changes``
    knobs (uniform count, uniform knobs, uniform other values) of the baseline source."""
    out = []
    for _ in range(n):
        res = apply_edits(
            task.baseline_source,
            sample_knob_edit(task.baseline_source, task.knob_space, rng, max_changes),
            "knobs",
        )
        assert res.ok and res.source is not None, res.reason  # knob_edit writes valid edits
        out.append(res.source)
    return out


def random_log_path(cfg: ResearchConfig, train: list[Any]) -> Path:
    """The random-edit log's cache file: shared by every run (any policy, any seed) with the same
    train tasks (and their definitions), size, seed and sandbox timeout. Free mode: the free-form
    code-edit log's (:func:`wmrl_research.code_edits.code_log_path`)."""
    if cfg.edit_mode == "free":
        return code_log_path(cfg.cache_dir, train, cfg.log_random_per_task, cfg.log_random_seed,
                             cfg.sandbox_timeout_s)  # fmt: skip
    tasks = [
        (t.id, t.data_version, hashlib.sha256(t.baseline_source.encode()).hexdigest()[:12], t.baseline_score,
         t.reference_score, sorted((k, [repr(v) for v in vs]) for k, vs in t.knob_space.items()))
        for t in train
    ]  # fmt: skip
    key = _key(
        [
            tasks,
            cfg.log_random_per_task,
            cfg.log_random_seed,
            RANDOM_LOG_MAX_CHANGES,
            cfg.sandbox_timeout_s,
            1,
            *_data_key(),
        ]
    )
    return Path(cfg.cache_dir) / f"random_log-{key}.jsonl"


def build_random_log(
    cfg: ResearchConfig, train: list[Any], executor, path: Path, progress: bool = True
) -> ExecutionLog:
    """Execute ``log_random_per_task`` random knob-space edits of each train task's baseline
    (:func:`random_edit_sources`) through ``executor`` and write them to the JSONL log at ``path``
    (``source = "random"``). Built once: an existing file is returned as it is. Ungraded executions
    (sandbox failures) are left out. ``<path>.json`` records how many executions it took and how long,
    so that they are reported apart from the RL budget.

    Free mode: the edits are random free-form code edits instead (:func:`wmrl_research.code_edits.
    build_code_log`, ``source = "code"``; resumable), what a free-form agent's WM pretrains on."""
    from wmrl.domain import Job
    from wmrl_research.grading import reward

    elog = ExecutionLog(path)
    if path.exists() or cfg.log_random_per_task == 0:
        return elog
    if cfg.edit_mode == "free":
        return build_code_log(
            train, cfg.log_random_per_task, cfg.log_random_seed, cfg.sandbox_timeout_s, executor, path,
            say=lambda msg: say(f"[research] {msg}", progress),
        )  # fmt: skip
    rng = random.Random(cfg.log_random_seed)
    jobs, owners = [], []
    for t in train:
        for src in random_edit_sources(t, cfg.log_random_per_task, rng):
            jobs.append(Job(fn=reward, args=(t.id, src, cfg.sandbox_timeout_s)))
            owners.append((t, src))
    t0 = time.perf_counter()
    what = (
        f"[research] random log: executing {len(jobs)} random knob edits ({cfg.log_random_per_task} per task)"
    )
    with stage(what, progress):
        results = executor.run(jobs)
    examples = [
        to_example(t, src, r.reward, "random")
        for (t, src), r in zip(owners, results, strict=True)
        if r.reward == r.reward
    ]
    seconds = time.perf_counter() - t0
    tmp = ExecutionLog(path.with_suffix(".partial"))
    tmp.path.unlink(missing_ok=True)
    tmp.append(examples)
    info = {"executions": len(jobs), "records": len(examples), "seconds": seconds,
            "per_task": cfg.log_random_per_task, "seed": cfg.log_random_seed}  # fmt: skip
    path.with_suffix(".json").write_text(json.dumps(info, indent=2))
    tmp.path.rename(path)
    say(f"[research] random log: {len(examples)} records in {seconds:.1f}s", progress)
    return elog


def log_name(log_path: Path, random_examples: list, random_path: Path) -> str:
    """The pretraining logs' names for the WM's cache key (the SFT log's alone without random edits,
    so the WMs cached before the random log existed stay valid)."""
    return log_path.name + (f"+{random_path.name}" if random_examples else "")


def random_info(path: Path, examples: list) -> dict[str, Any]:
    meta = path.with_suffix(".json")
    info = json.loads(meta.read_text()) if meta.exists() else {}
    runnable = [e.reward > FAILURE_SCORE for e in examples]
    return {
        **info,
        "n": len(examples),
        "runnable_frac": sum(runnable) / max(len(runnable), 1),
        "path": str(path),
    }
