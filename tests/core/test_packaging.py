"""Packaging: the core (wmrl/ with the toy) runs without the vla, research and ray extras; a run that
needs a missing extra says in one line which to install; the built wheel ships the presets."""

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Top-level modules of the vla, research and ray extras: none may be imported by the core.
EXTRA_MODULES = [
    "lerobot", "mujoco", "dm_control", "metaworld", "gymnasium", "datasets", "diffusers", "transformers",
    "tokenizers", "peft", "statsmodels", "palmerpenguins", "mnist1d", "vega_datasets",
    "all_minilm_l6_v2", "gguf", "ray",
]  # fmt: skip
BLOCKER = '''
import os, sys
BLOCKED = set(os.environ["WMRL_TEST_BLOCK"].split(","))
class _NotInstalled:
    """Every module of BLOCKED, and its submodules, import as if it were not installed."""
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
'''
TINY = (
    "domain: {type: toy, n_contexts: 8, n_actions: 4}\nexecutor: {type: inline}\n"
    "tracking: {wandb: disabled, progress: false}\n"
    "grpo: {steps: 2, tasks_per_step: 4, group_size: 4, optimizer: sgd, lr: 10.0}\n"
)


def without_extras(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``python *args`` with every module of the extras unimportable (a sitecustomize blocker)."""
    blocker = tmp_path / "blocker"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    env = os.environ | {"PYTHONPATH": str(blocker), "WMRL_TEST_BLOCK": ",".join(EXTRA_MODULES)}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def test_the_toy_runs_with_the_extras_unimportable(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    check = "import lerobot"
    assert "No module named 'lerobot'" in without_extras(tmp_path, "-c", check).stderr  # the blocker works
    core = "import wmrl.cli, wmrl.grid, wmrl.report, wmrl.runs, wmrl.executors, wmrl.export, wmrl.distributed"
    out = without_extras(tmp_path, "-c", core)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "run"
    out = without_extras(
        tmp_path, "-m", "wmrl.cli", "run", str(tmp_path / "tiny.yaml"), "--out-dir", str(run)
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (run / "summary.json").exists() and "eval/true_reward=" in out.stdout


@pytest.mark.parametrize(
    "argv, extra, needed_by",
    [
        (["vla-debug"], "vla", "domain.type=vla"),
        (["research-debug"], "research", "domain.type=research"),
        (["toy", "--executor.type=ray"], "ray", "executor.type=ray"),
    ],
)
def test_a_run_without_its_extra_says_which_to_install(tmp_path, argv, extra, needed_by):
    run = tmp_path / "run"
    out = without_extras(tmp_path, "-m", "wmrl.cli", "run", *argv, "--out-dir", str(run))
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith(f"wmrl: error: {needed_by} needs the {extra} extra, which is not installed")
    assert f"pip install 'wmrl[{extra}]'" in lines[0] and f"uv sync --extra {extra}" in lines[0]
    assert not run.exists()


def test_the_wheel_ships_the_presets(tmp_path):
    """Build the wheel, install it alone (no network, no dependencies) into a fresh venv whose
    dependencies come from this environment, and list the presets through the installed package."""
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "uv is needed to build the wheel"
    offline = {**os.environ, "UV_OFFLINE": "1", "UV_PYTHON_DOWNLOADS": "never"}

    def sh(*cmd: str) -> str:
        out = subprocess.run(cmd, cwd=tmp_path, env=offline, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, (cmd, out.stderr[-3000:])
        return out.stdout

    sh(uv, "build", "--wheel", "--out-dir", str(tmp_path / "dist"), str(ROOT))
    (wheel,) = (tmp_path / "dist").glob("wmrl-*.whl")
    venv = tmp_path / "venv"
    sh(uv, "venv", "--python", sys.executable, str(venv))
    python = venv / "bin" / "python"
    sh(uv, "pip", "install", "--python", str(python), "--no-deps", str(wheel))
    # the dependencies: this environment's site-packages, after the fresh venv's own
    fresh_site = sh(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    (Path(fresh_site) / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    listed = sh(str(venv / "bin" / "wmrl"), "presets")
    shipped = {line.split("\t")[0]: Path(line.split("\t")[1]) for line in listed.splitlines()}
    expected = sorted(p.stem for p in (ROOT / "wmrl" / "configs").glob("*.yaml"))
    assert sorted(shipped) == expected and "toy" in shipped
    for name, path in shipped.items():
        assert path.is_relative_to(fresh_site), path  # the installed package's copy, not the checkout's
        assert path.read_text() == (ROOT / "wmrl" / "configs" / f"{name}.yaml").read_text()
    loaded = sh(
        str(python), "-c", "from wmrl.config import load_config; print(load_config('toy').grpo.steps)"
    )
    assert loaded.strip() == "60"


def test_every_directly_imported_module_is_declared():
    """Each third-party module that the packaged code imports (anywhere in a file, lazily too)
    comes from a distribution that pyproject.toml declares, in the core or an extra."""
    import ast
    import re
    from importlib import metadata

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    declared = {norm(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in metadata.requires("wmrl")}
    own = {"wmrl", "sims", "world_models", "wmrl_vla", "wmrl_research"}
    providers = metadata.packages_distributions()
    undeclared = {}
    for package in sorted(own):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for top in {n.partition(".")[0] for n in names} - own - set(sys.stdlib_module_names):
                    if not {norm(d) for d in providers.get(top, [top])} & declared:
                        undeclared.setdefault(top, str(path.relative_to(ROOT)))
    assert undeclared == {}
