"""CLI consistency (issue 28, item 11): `export --out-dir` as every other verb, messages without
exception class names, a comparison root pointing to its runs, YAML errors in one line with the fix
for a list-valued override in a spec. Each bad input: one line, exit 2, nothing touched."""

import re
from dataclasses import dataclass

import pytest

from wmrl.cli import main
from wmrl.config import ConfigError, DomainConfig
from wmrl.grid import _brief
from wmrl.toy import ToyConfig

TINY = (
    "domain: {type: toy_exportable, n_contexts: 8, n_actions: 4}\nexecutor: {type: inline}\n"
    "tracking: {wandb: disabled, progress: false}\n"
    "grpo: {steps: 2, tasks_per_step: 4, group_size: 4, optimizer: sgd, lr: 10.0}\n"
)
CLASS_NAME = re.compile(r"\b[A-Z]\w*(Error|Exception|Enabled)\b")


@DomainConfig.register_subclass("toy_exportable")
@dataclass
class ExportableToyConfig(ToyConfig):
    """The toy domain with an export hook: its policy's logits as safetensors."""

    def export(self, run, state, out, adapter=False):
        from safetensors.torch import save_file

        save_file({"theta": state["policy"]["theta"].contiguous()}, str(out / "model.safetensors"))
        return {"policy": {"format": "safetensors", "files": ["model.safetensors"]}}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("consistency")
    (root / "tiny.yaml").write_text(TINY)
    (root / "cmp.yaml").write_text(
        "methods: [real, wmrl]\nseeds: [0]\nexecutor: {type: inline}\n"
        f"domains:\n  - {{name: toy, preset: {root / 'tiny.yaml'}, margin: 0.005}}\n"
    )
    assert main(["run", str(root / "tiny.yaml"), "--out-dir", str(root / "single")]) == 0
    assert main(["compare", str(root / "cmp.yaml"), "--out-dir", str(root / "cmp")]) == 0
    return root


def _one_line(capfd) -> str:
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("wmrl: error: ") and "Traceback" not in err, err
    assert not CLASS_NAME.search(lines[0]), lines[0]
    return lines[0]


def test_export_takes_out_dir_and_still_the_old_out(made, capfd):
    assert main(["export", str(made / "single"), "--out-dir", str(made / "e1")]) == 0
    assert (made / "e1" / "model.safetensors").exists()
    assert main(["export", str(made / "single"), "--out", str(made / "e2")]) == 0  # argparse prefix
    assert (made / "e2" / "model.safetensors").exists()
    capfd.readouterr()
    assert main(["export", str(made / "single"), "--out-dir", str(made / "e1")]) == 2
    assert f"--out-dir {made / 'e1'} is not empty" in _one_line(capfd)


def test_export_of_a_comparison_root_names_its_runs(made, capfd):
    capfd.readouterr()
    assert main(["export", str(made / "cmp"), "--out-dir", str(made / "e3")]) == 2
    line = _one_line(capfd)
    assert (
        f"{made / 'cmp'} is the root of a comparison (4 runs: toy/anchors_only/seed0, toy/real/seed0, "
        in line
    )
    assert (
        f"export one of its runs, e.g. wmrl export {made / 'cmp' / 'toy' / 'anchors_only' / 'seed0'} --out-dir"
        in line
    )
    assert not (made / "e3").exists()


def test_a_failed_push_is_one_line_without_the_exception_class(made, capfd):
    """Offline (HF_HUB_OFFLINE=1) huggingface_hub raises OfflineModeIsEnabled: the user reads its
    message, not its class."""
    capfd.readouterr()
    argv = ["export", str(made / "single"), "--out-dir", str(made / "e4"), "--push-to-hub", "me/toy"]
    assert main(argv) == 2
    assert _one_line(capfd).startswith("wmrl: error: export failed: ")


def test_malformed_yaml_is_one_line_with_line_and_column(tmp_path, capfd):
    (tmp_path / "bad.yaml").write_text("grpo:\n  steps: 3\n lr: [1, 2\n")
    capfd.readouterr()
    assert main(["run", str(tmp_path / "bad.yaml"), "--out-dir", str(tmp_path / "new")]) == 2
    assert _one_line(capfd) == (
        f"wmrl: error: malformed YAML in {tmp_path / 'bad.yaml'}, line 3, column 2: expected "
        "<block end>, but found '<block mapping start>' (while parsing a block mapping at line 1)"
    )
    assert not (tmp_path / "new").exists()


def test_unquoted_list_override_in_a_spec_names_the_fix(tmp_path, capfd):
    spec = tmp_path / "spec.yaml"
    spec.write_text("methods: [real]\ndomains:\n  - {name: t, preset: toy, overrides: [--domain.n_actions=4]}\n"
                    "  - name: u\n    preset: toy\n    overrides: [--compare.seeds=[0,1]]\n")  # fmt: skip
    capfd.readouterr()
    assert main(["compare", str(spec), "--out-dir", str(tmp_path / "grid")]) == 2
    line = _one_line(capfd)
    assert f"malformed YAML in {spec}, line 6, column 33: expected ',' or ']', but got '['" in line
    assert line.endswith('quote an override whose value is a list: "--domain.tasks=[a,b]"')
    assert not (tmp_path / "grid").exists()


def test_a_grid_cells_failure_reads_without_the_class_of_a_user_facing_error():
    assert _brief(ConfigError("domain.tasks is empty")) == "domain.tasks is empty"
    assert _brief(KeyError("x")) == "KeyError: 'x'"  # a bug keeps its class: it is the information
