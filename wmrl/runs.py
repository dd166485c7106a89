"""One training run: start it in a checked run directory, resume it, and compare its saved config.

``train_run`` is what ``wmrl run`` and every cell of a comparison grid (wmrl/grid.py) call."""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import tempfile
from pathlib import Path

from wmrl.checkpoints import config_diff
from wmrl.config import RunConfig, load_config, save_config, to_dict, upgrade_saved
from wmrl.domain import DomainCapabilities, check_domain_config
from wmrl.tracking import (
    CHECKPOINT,
    LOCK,
    START_POLICY,
    RunDirError,
    check_fresh,
    check_resumable_config,
    exclusive,
    policy_fingerprint,
    prepare_run_dir,
    read_metrics,
)

log = logging.getLogger("wmrl")


def train_run(cfg: RunConfig, resume: bool = False, start_policy: tuple[str, str] | None = None) -> dict[str, float]:  # fmt: skip
    """Build the domain and train one run in ``cfg.out_dir``; returns the last step's metrics.

    The run directory is checked before anything is built: a fresh run needs a writable directory
    holding no checkpoint; a resumed one steps left to train, and starts from step 0 where it
    stopped before its first checkpoint. The main process holds the directory's lock
    (``wmrl.tracking.exclusive``) from before it writes anything until the run ends: a second
    process on the same directory stops with an error naming the first.

    A fresh run records its starting policy's fingerprint in ``start_policy.json``;
    ``start_policy=(sha1, source)`` (a grid cell: its seed's other cells' start) refuses to train
    from another one, naming both, before the first step."""
    from wmrl.device import check_precision, resolve_device
    from wmrl.distributed import make_accelerator, wants_distributed

    check_precision(cfg.precision, resolve_device(cfg.device))  # fails here, before any preparation
    check_domain_config(cfg.domain)  # what the domain's config declares, refused before anything is written
    acc = make_accelerator(cfg) if wants_distributed(cfg) else None
    main = acc is None or acc.is_main_process
    out = Path(cfg.out_dir)
    restart = False  # resumed, but it stopped before its first checkpoint: trained from step 0
    if resume:
        _check_resumable(out, cfg)
        restart = not (out / CHECKPOINT).exists()
        resume = not restart
    skeleton = None
    if not resume and main:
        if comparison_runs(out):
            raise RunDirError(f"{out} holds a comparison ({_runs_brief(out)}); choose another --out-dir")
        check_fresh(out)  # before the lock: a refused run leaves the directory as it was
        skeleton = _Skeleton(out)
        writable_dir(out)
    try:
        with exclusive(out) if main else contextlib.nullcontext():
            return _train_locked(cfg, acc, resume, restart, start_policy)
    except Exception:
        if skeleton is not None:
            skeleton.remove_if_untrained()
        raise


class _Skeleton:
    """What a fresh run makes in its directory before it trains (the directory, ``run.lock``,
    ``config.yaml``, ``checkpoints/``, ``start_policy.json``, ``.wandb_id``): removed again when
    the run fails before its first step (a check of the built domain refused it, say), so that a
    refused run leaves no half-made run folder. Only what was not there before, only while the run
    logged no step and saved no checkpoint; anything else the build wrote (its caches) stays."""

    FILES = ("config.yaml", LOCK, START_POLICY, ".wandb_id", "checkpoints/latest.json")
    DIRS = ("checkpoints", "wandb")

    def __init__(self, out: Path):
        self.out = out
        self.existed = out.exists()
        self.before = {n for n in (*self.FILES, *self.DIRS) if (out / n).exists()}

    def remove_if_untrained(self) -> None:
        out = self.out
        if (out / CHECKPOINT).exists() or (out / "metrics.jsonl").exists():
            return  # it trained: a resume continues it
        for name in self.FILES:
            if name not in self.before:
                with contextlib.suppress(OSError):
                    (out / name).unlink()
        for name in (*self.DIRS, ""):
            if name in self.before or (name == "" and self.existed):
                continue
            with contextlib.suppress(OSError):
                (out / name).rmdir() if name else out.rmdir()  # only when empty


def _train_locked(cfg: RunConfig, acc, resume: bool, restart: bool, start_policy: tuple[str, str] | None) -> dict[str, float]:  # fmt: skip
    """``train_run`` past its checks, the run directory locked by the main process."""
    from wmrl.trainer import Trainer

    main = acc is None or acc.is_main_process
    build_cfg = cfg  # the domain builds its models on this rank's GPU (the saved config keeps cfg's)
    if acc is not None and acc.num_processes > 1 and cfg.device.startswith("cuda"):
        build_cfg = copy.copy(cfg)
        build_cfg.device = str(acc.device)
    out = Path(cfg.out_dir)
    if not resume and main:
        moved = prepare_run_dir(out, resume=False, cfg=cfg)
        save_config(cfg, out / "config.yaml")  # before the build: a run stopped in it can be resumed
        if restart or moved:
            log.warning(
                "%s holds no checkpoint (its run stopped before the first one): training %s from step 0%s",
                out,
                "it" if restart else "the new run",
                f"; moved {moved}" if moved else "",
            )
    if acc is not None:
        acc.wait_for_everyone()
    if acc is None:
        domain = cfg.domain.build(build_cfg)
    else:  # SFT on every rank; then the main process builds first and the others read its caches
        sft = check_domain_config(cfg.domain).sft_data_parallel
        if sft is not None and acc.num_processes > 1:  # SFT on every process, cached by the main one
            sft(build_cfg, acc)
        with acc.main_process_first():
            domain = cfg.domain.build(build_cfg)
    if not resume and main:
        _record_start(out, domain, start_policy)
    trainer = Trainer(cfg, domain, resume=resume, accelerator=acc)
    try:
        last = trainer.train()
    finally:
        trainer.caps.close_domain()  # e.g. the VLA domain's simulator pool
    if not main:
        return last
    if not last:  # killed after its last checkpoint but before summary.json: the last row is the summary
        rows = read_metrics(out)
        last = {k: v for k, v in rows[-1].items() if k != "step"} if rows else {}
    if last:
        (out / "summary.json").write_text(json.dumps(last, indent=2))
    return last


def _record_start(out: Path, domain, expected: tuple[str, str] | None) -> None:
    """Write the fresh run's starting-policy fingerprint, or refuse (closing the domain) when it is
    not ``expected``'s."""
    sha1 = policy_fingerprint(domain.policy)
    if expected is not None and sha1 != expected[0]:
        DomainCapabilities.of(domain).close_domain()
        raise RunDirError(
            f"{out} would start from policy {sha1[:12]}, not its seed's {expected[0][:12]} ({expected[1]}): "
            "every method of a seed must start from one policy. The domain's cached start (SFT, WM "
            "pretraining) differs between the grid's workers (built on CPUs that round differently, "
            "say): give every worker the same domain.cache_dir"
        )
    (out / START_POLICY).write_text(json.dumps({"policy_sha1": sha1}) + "\n")


def resume_run(run_dir: str | Path) -> dict:
    """Continue a killed run from its last checkpoint, with the config it was started with.
    Returns the run's last metrics. A comparison's root is refused, naming how to finish it."""
    run_dir = Path(run_dir)
    runs = comparison_runs(run_dir)
    if runs and (run_dir / "spec.yaml").exists():
        raise RunDirError(
            f"{run_dir} is a comparison grid ({_runs_brief(run_dir)}): rerun `wmrl compare SPEC --out-dir "
            f"{run_dir}` to finish it (its spec as last run: {run_dir / 'spec.yaml'}), or resume one run "
            f"with --resume {runs[0]}"
        )
    if runs:
        raise RunDirError(
            f"{run_dir} is the root of a comparison ({_runs_brief(run_dir)}) made by `wmrl run`, which "
            f"now trains one run: resume one run with --resume {runs[0]}, or run the methods as a grid "
            "(`wmrl compare SPEC`)"
        )
    if not (run_dir / "config.yaml").exists():
        raise RunDirError(f"cannot resume {run_dir}: it holds no run (no config.yaml)")
    cfg = load_config(run_dir / "config.yaml", [f"--out_dir={run_dir}"])
    return train_run(cfg, resume=True)


def _check_resumable(out: Path, cfg: RunConfig) -> None:
    rows = read_metrics(out) if (out / "metrics.jsonl").exists() else []
    done = rows and rows[-1].get("step", 0) >= cfg.grpo.steps and (out / "summary.json").exists()
    if done:
        raise RunDirError(
            f"{out} already finished its grpo.steps={cfg.grpo.steps} steps (summary.json); nothing to "
            "resume. To train further, start a new run (--out-dir) from a preset"
        )
    if not (out / CHECKPOINT).exists() and not (out / "config.yaml").exists():
        raise RunDirError(f"cannot resume {out}: it holds no checkpoint ({CHECKPOINT})")
    if (out / CHECKPOINT).exists():
        check_resumable_config(out, cfg)  # before the domain is built


def writable_dir(path: Path) -> None:
    """Create ``path`` (with its parents) and check that a file can be written there, or raise one
    RunDirError that names the directory and why."""
    for parent in [path, *path.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise RunDirError(f"out_dir={str(path)!r} cannot be created: {parent} is a file")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise RunDirError(
            f"out_dir={str(path)!r} is not a writable directory: {e.strerror} ({e.filename or path})"
        ) from None


def comparison_runs(root: Path) -> list[Path]:
    """The run directories of a comparison rooted at ``root``: a grid's
    (``root/<domain>/<method>/seed<k>``) or an older ``wmrl run`` comparison's (``root/<method>/seed<k>``)."""
    root = Path(root)
    found = [*root.glob("*/seed*/config.yaml"), *root.glob("*/*/seed*/config.yaml")]
    return sorted(p.parent for p in found)


def _runs_brief(root: Path) -> str:
    runs = comparison_runs(root)
    return f"{len(runs)} runs: {', '.join(str(r.relative_to(root)) for r in runs[:4])}" + (
        ", ..." if len(runs) > 4 else ""
    )


# Fields that do not change a run's results: where it runs, how it reports.
_BOOKKEEPING = (
    "out_dir",
    "executor",
    "torch_threads",
    "distributed",
    "tracking.progress",
    "tracking.wandb",
    "tracking.media_every",
    "tracking.max_ungraded_steps",
)


def result_fields(cfg: RunConfig | dict) -> dict:
    """The config as plain data without its bookkeeping fields (those that change no result)."""
    d = copy.deepcopy(cfg if isinstance(cfg, dict) else to_dict(cfg))
    for key in _BOOKKEEPING:
        section, _, leaf = key.rpartition(".")
        (d.get(section, {}) if section else d).pop(leaf, None)
    return d


def config_diffs(path: Path, want: RunConfig) -> list[str]:
    """``field: there X vs now Y`` for every result-relevant field where the run config saved at
    ``path`` differs from ``want``."""
    import yaml

    got = result_fields(upgrade_saved(yaml.safe_load(path.read_text()) or {}))
    now = result_fields(upgrade_saved(to_dict(want)))  # the same form: each component under its name
    return [f"{k}: {a!r} there vs {b!r} now" for k, a, b in config_diff(got, now)]
