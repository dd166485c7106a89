"""Every committed preset (wmrl/configs/) loads, and a run directory's ``config.yaml`` written from it
loads back to the very same config; every ``--domain.xxx=`` override of the committed grid specs
(benchmarks/specs/*.yaml) names one of its domain's flat fields. The domains' user-facing field
names keep their meaning while the code groups them (``VLAConfig.evaluation``) and registers their
choices (``wmrl_vla.policies``, ``wmrl_research.wm_kinds``). That each spec's cells load is
tests/core/test_compare.py's ``test_committed_specs_plan_every_cell``."""

import dataclasses
from pathlib import Path

import pytest

from wmrl.config import DomainConfig, load_config, load_domains, presets, save_config, to_dict

SPECS = Path(__file__).resolve().parents[1] / "benchmarks" / "specs"


@pytest.mark.parametrize("preset", sorted(presets()))
def test_every_preset_loads_and_its_run_dir_config_loads_back_the_same(preset, tmp_path):
    cfg = load_config(preset, [f"--out_dir={tmp_path}"])
    save_config(cfg, tmp_path / "config.yaml")
    assert to_dict(load_config(tmp_path / "config.yaml", [f"--out_dir={tmp_path}"])) == to_dict(cfg)


@pytest.mark.parametrize("spec", sorted(p.name for p in SPECS.glob("*.yaml")))
def test_every_domain_override_of_a_committed_spec_names_a_flat_field(spec):
    import yaml

    from wmrl.grid_spec import load_spec

    load_domains()
    for d in load_spec(SPECS / spec).domains:
        preset = yaml.safe_load(
            Path(d.preset if d.preset.endswith(".yaml") else presets()[d.preset]).read_text()
        )
        kind = (preset.get("domain") or {}).get("type", "toy")
        overrides = [*d.overrides, *d.reeval_overrides]
        kind = next((o.partition("=")[2] for o in overrides if o.startswith("--domain.type=")), kind)
        fields = {f.name for f in dataclasses.fields(DomainConfig.get_choice_class(kind))}
        for o in overrides:
            if o.startswith("--domain.") and not o.startswith("--domain.type="):
                assert o.removeprefix("--domain.").partition("=")[0].partition(".")[0] in fields, (spec, o)
