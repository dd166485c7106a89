"""What a :mod:`wmrl_research.sandbox` job sees of the host's filesystem: the bubblewrap arguments
that build its root (:func:`bwrap_argv`), the Python installation it needs (:func:`_python_layout`)
and the data files of the packages a task can import, covered by empty mounts
(:func:`task_data_packages`, :func:`package_data_files`, :data:`BUNDLED_DATA`). The isolation these
give is stated in wmrl_research/sandbox.py's docstring. (Moved out of that module unchanged; its
names are importable from there too.)"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import wmrl_research
from wmrl_research.sandbox_host import SandboxError, bwrap_path

# Where the sandbox sees the virtual environment and the worker package (not at their host paths,
# which lie inside the project's folder). The worker is run as ``python WORKER '<config>'``.
VENV_DIR = Path("/opt/venv")
WORKER_DIR = Path("/opt/wmrl")
WORKER = WORKER_DIR / "sandbox_worker"
# Besides the data files of every package a task draws from (derived: :func:`task_data_packages`,
# :func:`package_data_files`), these bundled copies of datasets (and test folders, which hold more
# copies: iris in scipy's and statsmodels' tests), relative to a site-packages folder, are covered
# by empty mounts too: packages no built-in task imports, whose data a user's task might draw on.
BUNDLED_DATA = (
    "sklearn/datasets/data",
    "sklearn/datasets/descr",
    "sklearn/datasets/images",
    "sklearn/datasets/tests",
    "statsmodels/datasets/*/*.csv",
    "statsmodels/datasets/*/*.s",
    "statsmodels/datasets/*/src",
    "statsmodels/**/tests",
    "scipy/**/tests",
    "vega_datasets/_data",
    "palmerpenguins/data",
    "pydataset/resources",
    "sktime/datasets/data",
    "seaborn/data",
)
# What a file of a package counts as code (never masked); every other file in a folder without code
# is data, and so is, next to code, a file in one of DATA_SUFFIXES (after a compression suffix).
CODE_SUFFIXES = (".py", ".pyc", ".pyi", ".pxd", ".pxi", ".pyx", ".so", ".pyd", ".h", ".hpp", ".c", ".cpp")
DATA_SUFFIXES = frozenset(
    ".csv .tsv .txt .dat .data .dta .sav .xpt .sas7bdat .por .arff .npz .npy .mat .h5 .hdf5 .nc"
    " .parquet .feather .xls .xlsx .ods .json .rda .rdata .rds .pkl .pickle .joblib .svmlight .libsvm"
    " .s .asc .rst .jpg .jpeg .png .gif .bmp .pgm .tif .tiff .wav .zip .tar".split()
)
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".lzma")
# Data files a package reads at run time that hold no dataset (masking them would break it).
RUNTIME_DATA = (
    "scipy/stats/_sobol_direction_numbers.npz",  # scipy.stats.qmc.Sobol's table
    *(
        f"vega_datasets/{n}.json" for n in ("datasets", "dataset_info", "local_datasets")
    ),  # names, read on import
)


def bwrap_argv(data_root: Path, jobs_root: Path) -> list[str]:
    """bubblewrap arguments: an empty root with read-only binds of what Python needs.

    Mounted: ``/usr``, ``/etc``, the base interpreter's installation, the virtual environment
    (at :data:`VENV_DIR`: its ``lib`` and ``pyvenv.cfg`` only), the worker package
    (:mod:`wmrl_research.sandbox_worker`, at :data:`WORKER`), the public data root ``data_root``
    (at ``/tmp/data``) and the jobs folder ``jobs_root`` (at ``/tmp/jobs``); never the project tree
    or the host's cwd. The packages' bundled copies of datasets (:data:`BUNDLED_DATA`) are covered
    by empty mounts.
    """
    argv = [
        bwrap_path() or "bwrap",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        # kept only by the worker and the per-job supervisor; the job drops them all
        *("--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"),
        *("--cap-add", "CAP_KILL", "--cap-add", "CAP_DAC_READ_SEARCH", "--cap-add", "CAP_NET_ADMIN"),
        *("--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"),
    ]
    for link in ("bin", "lib", "lib64", "sbin"):
        p = Path("/") / link
        if p.is_symlink():
            argv += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            argv += ["--ro-bind", str(p), str(p)]
    made: set[Path] = {Path("/"), Path("/usr"), Path("/etc"), Path("/tmp")}

    def parents(dst: Path) -> list[str]:
        out = []
        for parent in reversed(dst.parents):
            if parent not in made:
                out += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        made.add(dst)
        return out

    def bind_ro(src: Path, dst: Path | None = None) -> list[str]:
        dst = src if dst is None else dst
        return [*parents(dst), "--ro-bind", str(src), str(dst)]

    tmp = Path("/tmp")
    layout = _python_layout()
    binds = [(src, dst) for src, dst in layout.binds if tmp not in dst.parents]
    late = [(src, dst) for src, dst in layout.binds if tmp in dst.parents]
    for src, dst in binds:
        argv += bind_ro(src, dst)
    for target, dst in layout.symlinks:
        argv += [*parents(dst), "--symlink", target, str(dst)]
    argv += bind_ro(_worker_source(), WORKER)
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "0755", "--tmpfs", "/tmp"]
    argv += ["--perms", "0755", "--dir", "/tmp/work", "--perms", "0755", "--dir", "/tmp/jobs"]
    # An interpreter that lives under /tmp (a CI runner's, say) is bound in after /tmp's tmpfs.
    for src, dst in late:
        argv += bind_ro(src, dst)
    for path in layout.masked_dirs:
        argv += ["--tmpfs", str(path)]
    for path in layout.masked_files:
        argv += ["--ro-bind", "/dev/null", str(path)]
    argv += ["--ro-bind", str(data_root), "/tmp/data", "--bind", str(jobs_root), "/tmp/jobs"]
    argv += ["--chdir", "/tmp"]
    return argv


def _mounted_sources() -> list[Path]:
    """The host folders and files every sandbox mounts (read-only), resolved."""
    out = [Path("/usr"), Path("/etc")]
    out += [Path("/") / link for link in ("bin", "lib", "lib64", "sbin") if (Path("/") / link).is_dir()]
    out += [src for src, _ in _python_layout().binds]
    out.append(_worker_source())
    return [p.resolve() for p in out]


def _worker_source() -> Path:
    """The worker package's folder on the host (standard library only: the one piece of the project
    that a sandbox mounts)."""
    return Path(wmrl_research.__file__).resolve().parent / WORKER.name


def _refuse_a_mounted_data_root(root: Path) -> None:
    """Raise :class:`SandboxError` (one line) if the data root lies under a folder that every job
    sees: there, the hidden test labels and split secrets would be readable by path (a job finds the
    root in ``/proc/self/mountinfo``)."""
    where = root.resolve()
    for src in _mounted_sources():
        if where == src or src in where.parents:
            raise SandboxError(
                f"data root {str(where)!r} ($WMRL_RESEARCH_DATA) lies under {str(src)!r}, which every "
                "sandboxed job can read: its hidden test labels would be readable; put it elsewhere "
                "(default ~/.cache/wmrl/research)"
            )


def _project_root() -> Path:
    return Path(wmrl_research.__file__).resolve().parent.parent


@dataclass(frozen=True)
class _Layout:
    python: Path  # the interpreter, as the sandbox sees it
    binds: tuple[tuple[Path, Path], ...]  # (host path, sandbox path), read-only
    symlinks: tuple[tuple[str, Path], ...]  # (target, sandbox path)
    masked_dirs: tuple[Path, ...]  # sandbox paths covered by an empty tmpfs
    masked_files: tuple[Path, ...]  # sandbox paths covered by an empty file


def _skip(path: Path) -> bool:
    return str(path).startswith(("/usr", "/etc", "/proc", "/dev", "/sys")) or path in (
        Path("/"),
        Path("/tmp"),
    )


@cache
def _python_layout() -> _Layout:
    """What a sandboxed interpreter needs: the base installation (at its own path) and, when this
    process runs in a virtual environment, the venv's ``lib`` and ``pyvenv.cfg`` at
    :data:`VENV_DIR` (so no path of the project that holds the venv exists inside), minus the
    bundled datasets (:data:`BUNDLED_DATA`) and anything that names the project's location."""
    base = Path(sys.base_prefix).resolve()
    binds: list[tuple[Path, Path]] = [] if _skip(base) else [(base, base)]
    symlinks: list[tuple[str, Path]] = []
    site_dirs: list[tuple[Path, Path]] = [(Path(p), Path(p)) for p in _site_dirs(base)]
    python = Path(sys.executable).resolve()
    venv = Path(sys.prefix)
    if venv.resolve() != base and (venv / "pyvenv.cfg").exists():
        binds += [
            (venv / "pyvenv.cfg", VENV_DIR / "pyvenv.cfg"),
            ((venv / "lib").resolve(), VENV_DIR / "lib"),
        ]
        if (venv / "lib64").exists():
            symlinks.append(("lib", VENV_DIR / "lib64"))
        symlinks.append((str(python), VENV_DIR / "bin" / "python"))
        site_dirs += [(s, VENV_DIR / s.relative_to(venv.resolve())) for s in _site_dirs(venv.resolve())]
        python = VENV_DIR / "bin" / "python"
    dirs: list[Path] = []
    files: list[Path] = []
    project = str(_project_root())
    for host, inside in site_dirs:
        found = {p for pattern in BUNDLED_DATA for p in host.glob(pattern)}
        for name in task_data_packages():
            if (host / name).is_dir():
                pkg_dirs, pkg_files = package_data_files(host / name)
                found.update(pkg_dirs, pkg_files)
        for p in sorted(found, key=lambda p: len(p.parts)):
            (dirs if p.is_dir() else files).append(inside / p.relative_to(host))
        # an editable install names the project's folder: hide those files too
        for p in list(host.glob("*.pth")) + list(host.glob("*.dist-info/direct_url.json")):
            try:
                if project in p.read_text(errors="replace"):
                    files.append(inside / p.relative_to(host))
            except OSError:
                pass
    # a mask's own folder must not be masked already (e.g. a tests folder inside a masked one)
    dirs = _outermost(dirs)
    masked = set(dirs)
    files = [f for f in files if not _under(f, masked)]
    return _Layout(python, tuple(binds), tuple(symlinks), tuple(dirs), tuple(files))


@cache
def task_data_packages() -> tuple[str, ...]:
    """The top-level packages any task's data builder can draw from: every non-standard-library
    package imported by a task folder's code (its ``__init__.py`` and helpers, not its solutions),
    built-in and user folders alike, and by the tasks' shared helpers. Read from their source, not
    listed by hand."""
    import ast

    from wmrl_research.task_folders import task_folders

    tasks_dir = Path(wmrl_research.__file__).resolve().parent / "tasks"
    files = [p for p in tasks_dir.glob("*.py")]
    try:
        folders = list(task_folders().values())
    except Exception:  # noqa: BLE001 (a bad user folder is reported where tasks are listed)
        folders = [p.parent for p in tasks_dir.glob("*/__init__.py")]
    for folder in folders:
        files += [p for p in folder.rglob("*.py") if p.name not in ("solution.py", "reference.py")]
    names: set[str] = set()
    for path in files:
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    skip = set(sys.stdlib_module_names) | {"wmrl_research", "__future__"}
    return tuple(sorted(n for n in names if n not in skip))


def _under(path: Path, folders: set[Path]) -> bool:
    """Whether one of ``path``'s parents is in ``folders``."""
    return any(parent in folders for parent in path.parents)


def _outermost(folders: list[Path]) -> list[Path]:
    """``folders`` less those inside another of them (order kept)."""
    keep: list[Path] = []
    seen: set[Path] = set()
    for d in sorted(set(folders), key=lambda p: len(p.parts)):
        if not _under(d, seen):
            keep.append(d)
        seen.add(d)
    return keep


def _is_code(path: Path) -> bool:
    name = path.name
    return name.endswith(CODE_SUFFIXES) or ".so." in name or name == "py.typed"


def _data_suffix(path: Path) -> bool:
    name = path.name.lower()
    for comp in COMPRESSION_SUFFIXES:
        if name.endswith(comp):
            return True  # a compressed file in a package is data
    return Path(name).suffix in DATA_SUFFIXES


def package_data_files(package_dir: Path) -> tuple[list[Path], list[Path]]:
    """``(folders, files)`` to mask in one package: every folder whose whole tree holds no code
    (one mount each), and next to code every file with a data suffix, less :data:`RUNTIME_DATA`."""
    root = package_dir.parent
    keep = {root / p for p in RUNTIME_DATA}
    has_code: dict[Path, bool] = {}
    listing: dict[Path, list[Path]] = {}
    for dirpath, dirnames, filenames in os.walk(package_dir, topdown=False):
        d = Path(dirpath)
        listing[d] = [d / f for f in filenames]
        has_code[d] = (
            any(_is_code(d / f) for f in filenames)
            or any(has_code.get(d / sub, True) for sub in dirnames)
            or any(f in keep for f in listing[d])
        )
    dirs: list[Path] = []
    masked: set[Path] = set()
    files: list[Path] = []
    for d in sorted(listing, key=lambda p: len(p.parts)):
        if _under(d, masked):
            continue
        if not has_code[d] and d != package_dir:
            dirs.append(d)
            masked.add(d)
            continue
        files += [f for f in listing[d] if f not in keep and not _is_code(f) and _data_suffix(f)]
    return dirs, files


def _site_dirs(prefix: Path) -> list[Path]:
    """``lib/python3.X/site-packages`` (and ``dist-packages``) folders under ``prefix``."""
    out = []
    for lib in ("lib", "lib64"):
        for name in ("site-packages", "dist-packages"):
            out += [p.resolve() for p in (prefix / lib).glob(f"python3*/{name}") if p.is_dir()]
    return sorted(set(out))
