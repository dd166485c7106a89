"""docs/extending.md works as printed: its files become a package, the package's entry points are
installed as ``pip install -e`` installs them (a ``.dist-info`` folder with ``entry_points.txt`` on
the path), and the page's own ``uv run wmrl ...`` commands run through the real command line: the
new method trains on the toy, the toy's ``wmrl`` method and the new method train on the new domain,
the figure the page quotes is the run's, and the new domain passes one round of the Domain
contract's check (tests/test_domain_contract.py), as the page asks of a domain.

Each fenced block whose info string names a path (```` ```python my_wmrl/my_wmrl/guess.py ````) is
that file, written out as it is printed."""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "extending.md"
FILE_BLOCK = re.compile(r"^```\w+ (\S+)\n(.*?)^```$", re.M | re.S)
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```$", re.M | re.S)
# One process runs the page's commands through wmrl's own entry function, in order, each announced.
DRIVER = """
import os, shlex, sys
from wmrl.cli import main
for command in sys.argv[1:]:
    print("=== " + command, flush=True)
    rc = main(shlex.split(command))
    if rc:
        sys.exit(f"exit status {rc}: {command}")
# The new domain, built from the page's preset, through one round of the Domain contract's test.
sys.path.insert(0, os.environ["WMRL_TESTS"])
from test_domain_contract import contract_round
from wmrl.config import load_config
cfg = load_config("my_wmrl/guess.yaml", [])
contract_round(cfg.domain.build(cfg))
print("=== contract round", "ok", sep="\\n", flush=True)
"""


def page_files(text: str) -> dict[str, str]:
    """Every fenced block of ``text`` named by a path: path -> contents."""
    return {m.group(1): m.group(2) for m in FILE_BLOCK.finditer(text)}


def page_commands(text: str) -> list[str]:
    """The ``uv run wmrl ...`` commands of the page's bash blocks, without ``uv run wmrl`` and comments."""
    lines = [line for block in BASH_BLOCK.findall(text) for line in block.splitlines()]
    return [
        line.split("#")[0].strip().removeprefix("uv run wmrl ")
        for line in lines
        if line.startswith("uv run wmrl ")
    ]


def install(files: dict[str, str], where: Path) -> Path:
    """Write the page's files under ``where`` and install the project's entry points as an editable
    install does (``<name>-<version>.dist-info`` in its root, the root on the path); the root."""
    for path, text in files.items():
        (where / path).parent.mkdir(parents=True, exist_ok=True)
        (where / path).write_text(text)
    (pyproject,) = [where / p for p in files if p.endswith("pyproject.toml")]
    project = tomllib.loads(pyproject.read_text())["project"]
    dist = pyproject.parent / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    (dist / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())
            for group, points in project["entry-points"].items()
        )
    )
    return pyproject.parent


def test_the_page_names_its_files_and_commands():
    text = PAGE.read_text()
    assert set(page_files(text)) == {
        "my_wmrl/pyproject.toml",
        "my_wmrl/guess.yaml",
        "my_wmrl/my_wmrl/__init__.py",
        "my_wmrl/my_wmrl/half_trust.py",
        "my_wmrl/my_wmrl/guess.py",
    }
    assert page_commands("```bash\nuv run wmrl run toy --out-dir x   # a run\nls\n```\n") == [
        "run toy --out-dir x"
    ]


@pytest.mark.slow
def test_the_method_and_the_domain_of_the_page_run_as_the_page_runs_them(tmp_path):
    text = PAGE.read_text()
    root = install(page_files(text), tmp_path)
    commands = page_commands(text)
    env = {**os.environ, "PYTHONPATH": str(root), "WMRL_TESTS": str(ROOT / "tests")}
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, *commands],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    said = dict(part.split("\n", 1) for part in out.stdout.split("=== ")[1:])
    assert said["contract round"] == "ok\n"

    # The new method on the toy: its own hook's metric in every step's row.
    toy = [json.loads(line) for line in (tmp_path / "runs/half-trust/metrics.jsonl").read_text().splitlines()]
    steps = [row for row in toy if "half_trust/wm_weight" in row]
    assert len(steps) == 60 and {row["half_trust/wm_weight"] for row in steps} == {0.5}
    assert "method: half_trust" in said["config toy --method=half_trust"]
    assert "wm_weight: 0.5" in said["config toy --method=half_trust"]  # its own setting, listed
    quarter = (tmp_path / "runs/quarter-trust/metrics.jsonl").read_text().splitlines()
    assert {json.loads(line).get("half_trust/wm_weight") for line in quarter} - {None} == {0.25}
    placebo = (tmp_path / "runs/half-trust-placebo/metrics.jsonl").read_text().splitlines()
    assert sum("half_trust/wm_weight" in json.loads(line) for line in placebo) == 60
    assert "wm_placebo: true" in (tmp_path / "runs/half-trust-placebo/config.yaml").read_text()

    # The new domain: its tasks, and wmrl learning on it from the start the page quotes.
    assert said["tasks guess"].splitlines() == [f"guess/{k}\tguess\ttarget {k}" for k in range(10)]
    rows = [json.loads(line) for line in (tmp_path / "runs/guess/metrics.jsonl").read_text().splitlines()]
    scores = [row["eval/score"] for row in rows if "eval/score" in row]
    quoted = re.search(r"it starts at (\d\.\d+), .*? reaches about (\d\.\d+) in the 40 steps", text, re.S)
    assert quoted is not None and quoted.group(1) == f"{scores[0]:.3f}"
    summary = json.loads((tmp_path / "runs/guess/summary.json").read_text())
    assert abs(summary["eval/score"] - float(quoted.group(2))) < 0.02, summary["eval/score"]
    assert summary["exec/real_total"] == 40 * 4 * 8  # a quarter of the 16 groups a step executed
    assert "run directory: runs/guess" in said["run my_wmrl/guess.yaml --out-dir runs/guess"]
    # The new method on the new domain, with a domain field overridden.
    ht = [json.loads(line) for line in (tmp_path / "runs/guess-ht/metrics.jsonl").read_text().splitlines()]
    assert sum("half_trust/wm_weight" in row for row in ht) == 40
    assert "n: 20" in (tmp_path / "runs/guess-ht/config.yaml").read_text()
