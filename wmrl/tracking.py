"""Run directory, metrics (JSONL + wandb), progress bar and the run's lock and stop signals; the
checkpoints are wmrl/checkpoints.py (their names are importable from here too).

A run directory holds ``config.yaml``, ``metrics.jsonl`` (one flat, namespaced dict per step),
``checkpoints/latest.pt`` and, when the run ends, ``summary.json``. Nothing already written is ever
overwritten by a new run: starting a run in a directory that holds one is an error, and resuming
moves metric rows newer than the checkpoint to ``metrics.orphaned.jsonl`` instead of deleting them.
A directory whose run stopped before its first checkpoint holds nothing to resume: a new run (or
``--resume``, from step 0) reuses it, moving its metric rows to ``metrics.orphaned.jsonl`` and a
config that differs from the new one to ``config.orphaned.yaml``.

SIGINT and SIGTERM (:class:`StopSignals`) stop a run at the end of the step in progress, with a
checkpoint of that step; a second signal, sent at least ``SIGNAL_GRACE_S`` after the first, stops it
at once, keeping the last checkpoint. Copies of the first that arrive within that interval (``uv run``
forwards the SIGTERM that ``kill -- -PGID``, Slurm or Kubernetes send to the whole process group,
so the run receives it twice) count as that one signal.

A process that writes a run (or a grid) directory holds the lock of its ``run.lock`` file
(:func:`exclusive`), so a second process started on the same directory (``--resume`` while the run
trains, a grid rerun while it runs) stops with an error naming the first, and ``wmrl status`` tells
a running run from a stopped one (:func:`locked_by`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from wmrl.checkpoints import CHECKPOINT as CHECKPOINT
from wmrl.checkpoints import CHECKPOINT_STEP as CHECKPOINT_STEP
from wmrl.checkpoints import CheckpointWriteError as CheckpointWriteError
from wmrl.checkpoints import RunDirError as RunDirError
from wmrl.checkpoints import check_checkpoint_config as check_checkpoint_config
from wmrl.checkpoints import check_resumable_config as check_resumable_config
from wmrl.checkpoints import checkpoint_step as checkpoint_step
from wmrl.checkpoints import load_checkpoint as load_checkpoint
from wmrl.checkpoints import policy_fingerprint as policy_fingerprint
from wmrl.checkpoints import rng_state as rng_state
from wmrl.checkpoints import safe_load as safe_load
from wmrl.checkpoints import save_checkpoint as save_checkpoint
from wmrl.checkpoints import set_rng_state as set_rng_state
from wmrl.config import RunConfig, config_text, to_dict
from wmrl.lazy import lazy
from wmrl.signals import SIGNAL_GRACE_S, repeated_signal

if TYPE_CHECKING:
    import torch
else:
    torch = lazy("torch")

# The data a run's WM pretrained on before training (``{"executions", "sim_steps"}``, either may be
# absent), written by the domain's build and counted by a comparison report apart from the RL budget.
OFFLINE_DATA = "offline_data.json"
# The policy a fresh run started from (``{"policy_sha1"}``, :func:`policy_fingerprint`): a grid checks
# that every method of a seed started from the same one.
START_POLICY = "start_policy.json"
log = logging.getLogger("wmrl")


def say(message: str, enabled: bool = True) -> None:
    """One progress line on stderr (through tqdm, so an open bar stays intact); ``enabled`` is
    ``tracking.progress``."""
    if enabled:
        from tqdm.auto import tqdm

        tqdm.write(message, file=sys.stderr)


@contextlib.contextmanager
def stage(description: str, enabled: bool = True, refresh_s: float = 1.0, log_every_s: float = 60.0):
    """A long stage of a run (sandbox start, execution log, demos, SFT, WM pretraining,
    evaluation) shown on stderr while it runs: ``description [elapsed]``, counting every
    ``refresh_s`` on a terminal; elsewhere (a log file, a batch job's output) one line when it
    starts, one more every ``log_every_s`` while it runs (so a stage of minutes shows it is alive,
    and a log stays short) and one when it ends. ``enabled`` is ``tracking.progress``."""
    if not enabled:
        yield
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=None, desc=description, bar_format="{desc} [{elapsed}]", file=sys.stderr)
    done = threading.Event()
    tty = sys.stderr.isatty()
    start = time.monotonic()

    def tick() -> None:
        while not done.wait(refresh_s if tty else log_every_s):
            if tty:
                bar.refresh()
            else:
                elapsed = tqdm.format_interval(time.monotonic() - start)
                tqdm.write(f"{description} [{elapsed}, running]", file=sys.stderr)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        bar.close()


LOCK = "run.lock"
_held: set[str] = set()  # the lock files this process holds


@contextlib.contextmanager
def exclusive(directory: Path | str) -> Iterator[None]:
    """Hold ``directory/run.lock``'s exclusive lock (``flock``) for the block, or raise a
    RunDirError naming the process that holds it. Re-entrant within a process (a grid cell locks
    its run directory, then trains it through ``train_run``, which locks it again). The kernel
    drops the lock when the process ends, however it ends, so a killed run leaves nothing stale.
    The file keeps the holder's pid, host and start time for the error and for ``wmrl status``.
    Where the filesystem has no locks, a warning says so and the block runs unlocked."""
    path = Path(directory) / LOCK
    key = str(path.resolve())
    if key in _held:  # the outer block holds it and releases it
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        locked = True
        try:
            _flock_soon(fd)
        except BlockingIOError:
            raise RunDirError(
                f"{directory} is being written by another process ({_lock_text(path)}): wait for it to end, "
                "or stop it (Ctrl-C or SIGTERM checkpoint it) before starting this one"
            ) from None
        except OSError as e:
            log.warning("cannot lock %s (%s): nothing stops a second process writing it", path, e.strerror)
            locked = False
        if locked:
            os.ftruncate(fd, 0)
            stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode())
            _held.add(key)
        try:
            yield
        finally:
            _held.discard(key)
    finally:
        os.close(fd)  # releases the lock


def _flock_soon(fd: int, patience_s: float = 2.0) -> None:
    """Take ``fd``'s exclusive lock, retrying for ``patience_s`` (``locked_by`` holds a shared lock
    for an instant); BlockingIOError when another process holds it past that."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def locked_by(directory: Path | str) -> str | None:
    """Who holds ``directory``'s lock (``pid N on HOST since T``), or None when no process does."""
    path = Path(directory) / LOCK
    if not path.exists():
        return None
    if str(path.resolve()) in _held:
        return _lock_text(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _lock_text(path)
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


def _lock_text(path: Path) -> str:
    try:
        return path.read_text().strip() or "pid unknown"
    except OSError:
        return "pid unknown"


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM (a KeyboardInterrupt, so no ``except Exception`` on the
    way out takes it for a failure). ``saved_step``: the step of the checkpoint it holds now
    (0: none, a resume starts it from step 0); ``at_boundary``: it stopped between steps (the
    checkpoint is of its last finished step), not at once mid-step (a second signal)."""

    def __init__(self, signum: int, run_dir: Path, step: int, saved_step: int, at_boundary: bool):
        self.signum, self.run_dir, self.step = signum, run_dir, step
        self.saved_step, self.at_boundary = saved_step, at_boundary
        super().__init__(self.describe())

    def describe(self, resume: str | None = None) -> str:
        """One line: what stopped the run, what it saved, how to continue it (``resume``: the
        command to give; default ``wmrl run --resume RUN_DIR``)."""
        name = signal.Signals(self.signum).name
        resume = resume or f"wmrl run --resume {self.run_dir}"
        if self.at_boundary:
            done = f"stopped by {name} after step {self.step}, checkpoint of step {self.saved_step} saved"
        else:
            done = f"stopped at once by a second {name} during step {self.step + 1}"
            done += (
                f", its last checkpoint is of step {self.saved_step}"
                if self.saved_step
                else ", before its first checkpoint"
            )
        start = "" if self.saved_step else " (from step 0: no step was saved)"
        return f"{done}; continue it with `{resume}`{start}"


class StopSignals:
    """While entered (in the main thread; for each of SIGINT and SIGTERM that has a Python
    handler, see ``__enter__``): the first SIGINT or SIGTERM only records itself in
    ``signum`` (the run stops at the end of its step, saving it); a second one, at least
    ``grace_s`` (``SIGNAL_GRACE_S``) after the first, raises KeyboardInterrupt at once. One sooner
    is a copy of the first (one SIGTERM to a process group under ``uv run`` arrives twice) and
    changes nothing. The previous handlers come back on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, on_first=None, grace_s: float | None = None):
        self.signum: int | None = None
        self.first_at: float | None = None  # time.monotonic() of the first signal
        self.grace_s = SIGNAL_GRACE_S if grace_s is None else grace_s
        self._on_first = on_first  # called from the handler on the first signal (e.g. a bar notice)
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                # only a signal the process handles in Python (Ctrl-C's KeyboardInterrupt; SIGTERM
                # under `wmrl run`): one left ignored (nohup) or at its default action (a grid's
                # worker, which SIGTERM must end) keeps it
                if signal.getsignal(s) not in (signal.SIG_IGN, signal.SIG_DFL, None):
                    self._previous[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:
            if repeated_signal(self.first_at, self.grace_s):
                raise KeyboardInterrupt
            return  # a copy of the first signal (forwarded by a launcher), not a second one
        self.signum, self.first_at = signum, time.monotonic()
        if self._on_first is not None:
            self._on_first(signum)

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}


@dataclass
class Video:
    """A rollout as frames ``[T, 3, H, W]`` uint8 (several side by side: concatenated along W)."""

    frames: np.ndarray
    fps: int = 8
    caption: str = ""


@dataclass
class Table:
    """Rows of rollouts (``columns`` names, ``rows`` lists of plain values)."""

    columns: list[str]
    rows: list[list[Any]]


def table_value(v: Any) -> Any:
    """A plain table cell: tensors and numpy scalars as Python numbers, NaN (not measured) as None."""
    v = _plain(v)
    return None if isinstance(v, float) and v != v else v


def write_gif(frames: np.ndarray, path: Path, fps: int = 8) -> Path:
    """``frames`` ``[T, 3, H, W]`` (or ``[T, H, W, 3]``) uint8 -> an endlessly looping GIF at ``path``."""
    from PIL import Image

    frames = np.asarray(frames)
    if frames.ndim != 4 or 3 not in (frames.shape[1], frames.shape[-1]):
        raise ValueError(f"frames must be [T, 3, H, W] or [T, H, W, 3], got {frames.shape}")
    if frames.shape[1] == 3 and frames.shape[-1] != 3:
        frames = frames.transpose(0, 2, 3, 1)
    images = [Image.fromarray(np.ascontiguousarray(f.astype(np.uint8))) for f in frames]
    path.parent.mkdir(parents=True, exist_ok=True)
    images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return path


class MetricsLogger:
    """Appends one JSON line per step to ``metrics.jsonl`` and mirrors it to wandb (offline by default).

    wandb gets the run's config as its config, every metric (the WM diagnostics ``ppi/*``, ``wm/*``,
    ``denoise/*``, ``debias/*`` are charted against ``step``) and, through :meth:`log_media`, rollout
    media: :class:`Video` as a GIF (also kept under ``<run_dir>/media/``), :class:`Table` as a
    ``wandb.Table``."""

    def __init__(self, run_dir: Path, cfg: RunConfig, resume: bool):
        self.path = run_dir / "metrics.jsonl"
        self._wandb = None
        if cfg.tracking.wandb != "disabled":
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            self._wandb = wandb.init(
                project=cfg.tracking.project,
                dir=str(run_dir),
                mode=cast(Literal["online", "offline", "disabled"], cfg.tracking.wandb),
                config=to_dict(cfg),
                id=_wandb_id(run_dir),
                resume="allow" if resume else None,
                reinit="finish_previous",
            )
            self._wandb.define_metric("step")
            self._wandb.define_metric("*", step_metric="step")
        self.media_dir = run_dir / "media"

    @property
    def wandb_active(self) -> bool:
        return self._wandb is not None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self._wandb is not None:
            self._wandb.log(row, step=step)

    def log_media(self, step: int, media: dict[str, Video | Table]) -> None:
        """Rollout media of ``step`` to wandb (GIFs also under ``media/``); nothing without wandb."""
        if self._wandb is None or not media:
            return
        import wandb

        row: dict[str, Any] = {"step": step}
        for key, item in media.items():
            if isinstance(item, Video):
                name = key.replace("/", "-")
                path = write_gif(item.frames, self.media_dir / f"{name}-step{step:06d}.gif", item.fps)
                row[key] = wandb.Video(str(path), caption=item.caption or None, format="gif")
            elif isinstance(item, Table):
                row[key] = wandb.Table(
                    columns=item.columns, data=[[table_value(v) for v in r] for r in item.rows]
                )
            else:
                raise TypeError(f"media[{key!r}] is a {type(item).__name__}, not a Video or a Table")
        self._wandb.log(row, step=step)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _wandb_id(run_dir: Path) -> str:
    """A stable wandb run id per run directory, so a resumed run continues the same wandb run."""
    f = run_dir / ".wandb_id"
    if not f.exists():
        f.write_text(os.urandom(6).hex())
    return f.read_text().strip()


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.item()
    if isinstance(v, np.generic):
        return v.item()
    return v


def read_metrics(run_dir: Path | str) -> list[dict]:
    """The rows of ``metrics.jsonl``; a truncated last line (a run killed mid-write) is left out."""
    return _read_rows(Path(run_dir) / "metrics.jsonl")[0]


def _read_rows(path: Path) -> tuple[list[dict], str | None]:
    """(rows, the truncated last line or None). A bad line before the last one is an error: that is
    not a killed write but a damaged file, and guessing would lose data."""
    if not path.exists():
        return [], None
    lines = path.read_text().splitlines()
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                return rows, line
            raise RunDirError(f"{path}: line {i + 1} is not JSON ({e.msg}); repair or remove it") from None
    return rows, None


def check_fresh(run_dir: Path) -> None:
    """A new run needs a directory that holds no run to resume (no checkpoint)."""
    if (run_dir / CHECKPOINT).exists():
        raise RunDirError(
            f"{run_dir} already holds a run; pass --resume {run_dir} to continue it, or choose another --out-dir"
        )


def prepare_run_dir(run_dir: Path, resume: bool, cfg: RunConfig | None = None) -> str:
    """Create a fresh run directory, or check that a resumable one exists.

    A fresh run may reuse a directory whose run stopped before its first checkpoint: its metric rows
    move to ``metrics.orphaned.jsonl`` and its ``config.yaml``, where it differs from ``cfg``'s, to
    ``config.orphaned.yaml`` (nothing written is deleted). Returns what moved ("" if nothing)."""
    if resume:
        if not (run_dir / CHECKPOINT).exists():
            raise RunDirError(f"cannot resume {run_dir}: it holds no checkpoint ({CHECKPOINT})")
        return ""
    check_fresh(run_dir)
    moved = []
    if (run_dir / "metrics.jsonl").exists():
        n = trim_metrics_after(run_dir, -1)
        (run_dir / "metrics.jsonl").unlink()
        if n:
            moved.append(f"its {n} metric rows to metrics.orphaned.jsonl")
    saved = run_dir / "config.yaml"
    if cfg is not None and saved.exists() and saved.read_text() != config_text(cfg):
        os.replace(saved, run_dir / "config.orphaned.yaml")
        moved.append("its other config to config.orphaned.yaml")
    if (run_dir / ".wandb_id").exists():  # a new wandb run: the old one's offline files stay
        os.replace(run_dir / ".wandb_id", run_dir / ".wandb_id.orphaned")
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    return " and ".join(moved)


def trim_metrics_after(run_dir: Path, step: int) -> int:
    """Keep metric rows with ``step <= step`` in ``metrics.jsonl``; move later rows (logged after the
    last checkpoint by a run that was killed) to ``metrics.orphaned.jsonl``. Returns how many moved."""
    rows, truncated = _read_rows(run_dir / "metrics.jsonl")
    if truncated is not None:
        log.warning(
            "%s: dropped its truncated last line (%d characters: %r), kept the %d rows before it",
            run_dir / "metrics.jsonl",
            len(truncated),
            truncated[:60],
            len(rows),
        )
    keep = [r for r in rows if r["step"] <= step]
    moved = [r for r in rows if r["step"] > step]
    if moved or truncated is not None:
        if moved:
            with open(run_dir / "metrics.orphaned.jsonl", "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in moved)
        tmp = run_dir / "metrics.jsonl.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
        os.replace(tmp, run_dir / "metrics.jsonl")
    return len(moved)


def set_aside_after_checkpoint(run_dir: Path, step: int) -> int:
    """A resume from the checkpoint of ``step``: :func:`trim_metrics_after`, saying what it moved
    (the rows a killed run logged after its last checkpoint, steps the resume trains again)."""
    rows = [r["step"] for r in read_metrics(run_dir) if r["step"] > step]
    moved = trim_metrics_after(run_dir, step)
    if moved:
        log.warning(
            "%s: resuming from the checkpoint of step %d; the %d metric row(s) logged after it (steps %s, "
            "trained again now) moved to metrics.orphaned.jsonl",
            run_dir,
            step,
            moved,
            f"{rows[0]}-{rows[-1]}" if len(rows) > 1 else rows[0],
        )
    return moved
