from pathlib import Path

import pytest

from wmrl.config import ConfigError, load_config, presets

SPECS = Path(__file__).resolve().parents[2] / "benchmarks" / "specs"


def test_defaults_and_cli_overrides():
    cfg = load_config(None, ["--grpo.group_size=4", "--anchors.fraction=0.5", "--method=mix"])
    assert cfg.grpo.group_size == 4 and cfg.anchors.fraction == 0.5 and cfg.method == "mix"
    assert cfg.domain.type if hasattr(cfg.domain, "type") else True
    assert type(cfg.domain).__name__ == "ToyConfig"


def test_preset_then_overrides_win():
    cfg = load_config("toy", ["--grpo.steps=3", "--domain.noise=0.5"])
    assert cfg.grpo.steps == 3 and cfg.domain.noise == 0.5
    assert cfg.grpo.advantage == "dr_grpo"  # from the preset


def test_unknown_method_quotes_value_and_choices():
    with pytest.raises(ConfigError, match=r"method='reinforce' is not one of real, anchors_only, wm, mix"):
        load_config(None, ["--method=reinforce"])


def test_invalid_values_are_quoted():
    with pytest.raises(ConfigError, match=r"grpo.group_size=1 must be >= 2"):
        load_config(None, ["--grpo.group_size=1"])
    with pytest.raises(ConfigError, match=r"denoise.w_target=5.0 must lie in \[1, denoise.w_max=4.0\]"):
        load_config(None, ["--denoise.w_target=5"])


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ConfigError, match="unknown preset 'nope'; known presets: .*toy"):
        load_config("nope")
    assert "toy" in presets()


def test_malformed_yaml_names_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo: {group_size: [1, 2\n")
    with pytest.raises(ConfigError, match="malformed YAML in .*bad.yaml"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(listy)


def test_unknown_field_and_domain_are_errors(tmp_path):
    y = tmp_path / "x.yaml"
    y.write_text("grpo:\n  group_sise: 8\n")
    with pytest.raises(ConfigError, match="group_sise"):
        load_config(y)
    with pytest.raises(ConfigError, match="nosuchdomain"):
        load_config(None, ["--domain.type=nosuchdomain"])


def test_a_run_saved_before_the_comparison_and_executor_merge_still_loads(tmp_path):
    """A config.yaml from before: its (empty) `compare` section is dropped and `executor.ray_num_cpus`
    (now `executor.num_cpus`) too, so the run resumes; a preset that asks `wmrl run` for a comparison
    is refused with the grid to use."""
    import yaml

    from wmrl.config import save_config

    save_config(load_config("toy"), tmp_path / "new.yaml")
    saved = yaml.safe_load((tmp_path / "new.yaml").read_text())
    saved["compare"] = {"methods": [], "seeds": [], "threshold": None, "threshold_metric": "x"}
    saved["executor"]["ray_num_cpus"] = 2.0
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(saved))
    assert load_config(tmp_path / "old.yaml") == load_config("toy")
    saved["compare"]["methods"] = ["real", "ppi"]
    (tmp_path / "cmp.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(
        ConfigError, match=r"compare.methods in .*`wmrl run` trains one run.*`wmrl compare SPEC`"
    ):
        load_config(tmp_path / "cmp.yaml")


def test_runs_and_grids_share_one_executor_config():
    """One ExecutorConfig: a run's `executor:` section and a grid spec's are the same type, checked
    the same way."""
    import typing

    from wmrl.config import ExecutorConfig, RunConfig
    from wmrl.grid_spec import GridSpec

    assert typing.get_type_hints(RunConfig)["executor"] is ExecutorConfig
    assert typing.get_type_hints(GridSpec)["executor"] is ExecutorConfig
    with pytest.raises(ConfigError, match=r"executor.workers=0 must be >= 1"):
        load_config("toy", ["--executor.workers=0"])


@pytest.mark.parametrize("spec", sorted(p.name for p in SPECS.glob("*.yaml")))
def test_every_benchmark_spec_parses(spec):
    from wmrl.grid_spec import load_spec

    parsed = load_spec(SPECS / spec)
    assert parsed.domains and parsed.executor.type in ("process", "ray", "inline")
