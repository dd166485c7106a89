"""Checkpoints of a run: ``checkpoints/latest.pt`` written atomically with the run's config
fingerprint and RNG states, read back with ``torch.load(weights_only=True)`` (:func:`safe_load`), and
refused in one line where the config no longer matches it. wmrl/tracking.py (the run directory,
metrics and progress) imports these names from here, so they are importable from either module.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from wmrl.config import RunConfig, config_fingerprint, upgrade_saved
from wmrl.lazy import lazy

if TYPE_CHECKING:
    import torch
else:
    torch = lazy("torch")

CHECKPOINT = "checkpoints/latest.pt"
# The step of ``CHECKPOINT`` (``{"step": N}``), written after it: ``wmrl status`` reads it without torch.
CHECKPOINT_STEP = "checkpoints/latest.json"


class RunDirError(RuntimeError):
    """A run directory that cannot be used as asked (exists, missing, or does not match the config)."""


def policy_fingerprint(policy: torch.nn.Module) -> str:
    """SHA-1 of a policy's parameters and buffers: every ``state_dict`` entry's name, dtype, shape and
    bytes, in name order. Equal for equal weights whatever the device; two builds of one start on
    machines whose kernels round differently (SFT on another CPU) differ."""
    digest = hashlib.sha1()
    for name, value in sorted(policy.state_dict().items()):
        if not isinstance(value, torch.Tensor):  # a module's extra state
            digest.update(f"{name}|{value!r}|".encode())
            continue
        digest.update(f"{name}|{value.dtype}|{tuple(value.shape)}|".encode())
        digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def rng_state() -> dict:
    """The process's RNG states as tensors and plain Python values, so a checkpoint holding them loads
    with ``torch.load(..., weights_only=True)`` (numpy's state is a tuple with an array in it)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": (
            str(name),
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        ),
        "python": random.getstate(),
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    np.random.set_state((name, keys.astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])


def safe_load(path: Path | str, map_location: str | torch.device | None = "cpu", mmap: bool = False) -> Any:
    """``torch.load`` with ``weights_only=True``: tensors, plain containers and numbers, never code.

    Checkpoints written before RNG states were stored as plain values hold numpy's state as an array;
    the few numpy globals that rebuild an array (no code) are allowed for those. Anything else a
    pickle names (a class, a function such as ``os.system``) is refused with
    ``pickle.UnpicklingError``.
    """
    with torch.serialization.safe_globals(_NUMPY_ARRAY_GLOBALS):
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap or None)


def _numpy_array_globals() -> list:
    core = np._core if hasattr(np, "_core") else np.core  # numpy >= 2 : numpy 1
    _reconstruct = core.multiarray._reconstruct
    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


_NUMPY_ARRAY_GLOBALS = _numpy_array_globals()


def save_checkpoint(run_dir: Path, cfg: RunConfig, state: dict) -> Path:
    """Write ``checkpoints/latest.pt`` atomically (a killed save leaves the previous one intact)."""
    path = run_dir / CHECKPOINT
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    try:
        # through a Python file: a full disk is an OSError (ENOSPC), not torch's "enforce fail ...
        # unexpected pos" of its own writer
        with open(tmp, "wb") as f:
            torch.save({"fingerprint": config_fingerprint(cfg), "rng": rng_state(), **state}, f)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise CheckpointWriteError(_save_failure(run_dir, state.get("step"), e)) from None
    step_tmp = run_dir / (CHECKPOINT_STEP + ".tmp")
    try:
        step_tmp.write_text(json.dumps({"step": state.get("step")}) + "\n")
        os.replace(step_tmp, run_dir / CHECKPOINT_STEP)
    except OSError:  # the checkpoint is saved; checkpoint_step reads a stale side file's step from it
        with contextlib.suppress(OSError):
            step_tmp.unlink()
    return path


class CheckpointWriteError(RunDirError):
    """A checkpoint that could not be written (a full disk, say); the previous one is kept."""


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _save_failure(run_dir: Path, step: int | None, e: BaseException) -> str:
    """One line: why the checkpoint of ``step`` was not written, what was kept, how to go on."""
    full = getattr(e, "errno", None) in _DISK_FULL or any(
        text in str(e) for text in ("unexpected pos", "file write failed", "No space left")
    )
    try:
        free = f"{shutil.disk_usage(run_dir).free / 2**20:.0f} MiB free"
    except OSError:
        free = "free space unknown"
    why = (
        f"the disk is full ({free})"
        if full
        else f"{getattr(e, 'strerror', None) or ' '.join(str(e).split())}"
    )
    kept = checkpoint_step(run_dir)
    last = (
        f"the last checkpoint (step {kept}) is kept" if kept is not None else "no earlier checkpoint exists"
    )
    return (
        f"cannot save the checkpoint of step {step} in {run_dir / CHECKPOINT}: {why}; {last} and the "
        f"partial file removed; free space, then `wmrl run --resume {run_dir}` continues"
        + (f" from step {kept}" if kept is not None else " from step 0")
    )


def checkpoint_step(run_dir: Path | str) -> int | None:
    """The step of ``run_dir``'s checkpoint (None without one): from ``CHECKPOINT_STEP`` when it is
    at least as new as the checkpoint, else (a run saved before it existed, or killed between the
    two writes) from the checkpoint itself, memory-mapped."""
    path, side = Path(run_dir) / CHECKPOINT, Path(run_dir) / CHECKPOINT_STEP
    if not path.exists():
        return None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if side.stat().st_mtime >= path.stat().st_mtime:
            return int(json.loads(side.read_text())["step"])
    try:
        return int(safe_load(path, mmap=True)["step"])
    except Exception:
        return None


def load_checkpoint(run_dir: Path, cfg: RunConfig) -> dict:
    """Load the checkpoint and check it was written by a run with the same configuration."""
    path = run_dir / CHECKPOINT
    try:
        state = safe_load(path)
    except Exception as e:
        raise RunDirError(f"cannot read checkpoint {path}: {e}") from e
    check_checkpoint_config(run_dir, cfg, state.get("fingerprint", {}))
    return state


def check_resumable_config(run_dir: Path, cfg: RunConfig) -> None:
    """:func:`check_checkpoint_config` of the checkpoint in ``run_dir``, read memory-mapped (its
    tensors are not loaded): a resume checks its config before it builds the domain (minutes of
    SFT and WM pretraining for some)."""
    path = run_dir / CHECKPOINT
    try:
        state = safe_load(path, mmap=True)
    except Exception:  # an old (non-zip) format cannot be mapped; load_checkpoint reads it later
        return
    check_checkpoint_config(run_dir, cfg, state.get("fingerprint", {}))


def check_checkpoint_config(run_dir: Path, cfg: RunConfig, fingerprint: dict) -> None:
    """Refuse a checkpoint (its config ``fingerprint``) that ``cfg`` (the run's ``config.yaml``)
    does not match, in one line that names each field and says what works: ``--resume`` takes no
    overrides, so the values go back into ``config.yaml``; a new run takes the edited ones."""
    path = run_dir / CHECKPOINT
    want, got = config_fingerprint(cfg), upgrade_saved(fingerprint)
    if want == got:
        return
    diffs = config_diff(got, want)
    saved = run_dir / "config.yaml"
    raise RunDirError(
        f"checkpoint {path} does not match the config: "
        + "; ".join(f"{k}: checkpoint {a!r} vs config {b!r}" for k, a, b in diffs[:8])
        + f". To continue it as it ran, set {'these values' if len(diffs) > 1 else 'this value'} back in "
        + f"{saved} ("
        + ", ".join(f"{k}: {_flag_value(a)}" for k, a, _ in diffs[:8])
        + f") and rerun `wmrl run --resume {run_dir}`; to train with the config's values, start a new run "
        + f"from it: `wmrl run {saved} --out-dir NEW_DIR`"
    )


def _flag_value(value: Any) -> str:
    """A saved value as a command-line override writes it (``null`` for None)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def config_diff(a: Any, b: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``(dotted key, a's value, b's value)`` for every leaf where the nested dicts ``a`` and ``b``
    differ, keys in sorted order."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += config_diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [(prefix.rstrip("."), a, b)]
