"""``wmrl archive GRID_DIR --out-dir DIR``: a grid's results without its checkpoints, small enough to
commit, from which ``wmrl compare`` resumes.

A long grid runs over many sessions or machines, a few seeds at a time, and its results should be kept
as they land. ``DIR`` receives every file of ``GRID_DIR`` except:

- the cells that have not finished (no ``summary.json`` or no current ``reeval.json``): a later
  ``wmrl compare`` runs them again from the start;
- checkpoints (``checkpoints/``) and lock files;
- any file over ``max_bytes`` (listed as left out).

Copying ``DIR`` back as a grid directory and running ``wmrl compare SPEC --out-dir COPY`` keeps its
finished cells and their re-evaluations, checks the recorded starts, and runs the rest."""

from __future__ import annotations

import shutil
from pathlib import Path

from wmrl.config import ConfigError

#: Files and folders of a run directory that hold training state, not results.
SKIPPED_DIRS = ("checkpoints",)
SKIPPED_SUFFIXES = (".lock",)


def archive_grid(src: str | Path, dst: str | Path, max_bytes: int = 5 * 2**20) -> dict:
    """Copy the results of the grid in ``src`` to ``dst`` (module docstring). Returns ``{"files",
    "finished", "not_finished", "left_out"}``: the number of files copied, the finished cells' names,
    the other cells' ``name: state``, and ``"path (size)"`` of each file over ``max_bytes``."""
    from wmrl.grid import plan
    from wmrl.grid_spec import cell_status, load_spec

    src, dst = Path(src), Path(dst)
    if not ((src / "spec.yaml").exists() and (src / "index.json").exists()):
        raise ConfigError(f"{src} is not a grid directory (spec.yaml and index.json, from `wmrl compare`)")
    if dst.resolve() == src.resolve() or src.resolve() in dst.resolve().parents:
        raise ConfigError(f"--out-dir {dst} lies inside the grid {src}: archive it elsewhere")
    spec_text = (src / "spec.yaml").read_text()
    if (dst / "spec.yaml").exists() and (dst / "spec.yaml").read_text() != spec_text:
        raise ConfigError(f"{dst} holds another grid's archive (its spec.yaml differs from {src}'s)")
    cells = plan(load_spec(src / "spec.yaml"), src)
    state = {Path(c.run_dir).resolve(): (c.name, cell_status(c)) for c in cells}
    copied, left_out = 0, []
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = path.relative_to(src)
        if set(rel.parts) & set(SKIPPED_DIRS) or path.suffix in SKIPPED_SUFFIXES:
            continue
        owner = next((state[d] for d in path.resolve().parents if d in state), None)
        if owner is not None and owner[1] != "finished":
            continue
        size = path.stat().st_size
        if size > max_bytes:
            left_out.append(f"{rel} ({size / 2**20:.1f} MB)")
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dst / rel)
        copied += 1
    return {
        "files": copied,
        "finished": [name for name, s in state.values() if s == "finished"],
        "not_finished": {name: s for name, s in state.values() if s != "finished"},
        "left_out": left_out,
    }
