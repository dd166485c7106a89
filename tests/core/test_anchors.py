"""Anchor counts: one formula, and no count that a method would silently reinterpret."""

import pytest

from wmrl.cli import main
from wmrl.config import AnchorConfig, ConfigError, load_config
from wmrl.methods import get_method

TINY = [
    "--domain.n_contexts=8",
    "--executor.type=inline",
    "--tracking.wandb=disabled",
    "--tracking.progress=false",
    "--grpo.steps=1",
    "--grpo.tasks_per_step=4",
    "--grpo.group_size=4",
]


def test_the_count_is_the_rounded_fraction_raised_to_the_minimum():
    cfg = AnchorConfig(fraction=0.1, min_groups=1)
    assert [cfg.count(n) for n in (4, 10, 16, 25)] == [1, 1, 2, 3]
    assert AnchorConfig(fraction=0.1, min_groups=0).count(4) == 0
    assert get_method("ppi").n_anchor_groups(16, cfg) == 2
    assert get_method("real").n_anchor_groups(16, cfg) == 16


@pytest.mark.parametrize("method", ["ppi", "anchors_only", "wmrl"])
def test_fraction_zero_is_an_error_for_a_method_that_executes_anchors(method):
    """anchors.fraction=0 used to execute anchors.min_groups groups a step in silence."""
    with pytest.raises(ConfigError) as e:
        load_config("toy", [f"--method={method}", "--anchors.fraction=0"])
    msg = str(e.value)
    assert "anchors.fraction=0 with method=" in msg and "anchors.min_groups=1 group(s) per step" in msg
    assert "one group of grpo.tasks_per_step=16 is 0.0625" in msg and "method='wm'" in msg


def test_no_anchor_group_a_step_is_an_error_and_wm_and_real_ignore_the_fraction():
    with pytest.raises(ConfigError) as e:
        load_config("toy", ["--method=ppi", "--anchors.min_groups=0", "--anchors.fraction=0.03"])
    assert str(e.value) == (
        "anchors.fraction=0.03 of grpo.tasks_per_step=16 rounds to 0 anchor groups per step with "
        "anchors.min_groups=0; method='ppi' needs at least one (a step without anchors gives no unbiased "
        "update): set anchors.min_groups=1 or raise anchors.fraction to >= 0.03125"
    )
    for method in ("wm", "real"):
        assert load_config("toy", [f"--method={method}", "--anchors.fraction=0"]).anchors.fraction == 0


def test_the_cli_says_it_in_one_line_with_exit_2(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "toy", "--out-dir", str(out), *TINY, "--method=ppi", "--anchors.fraction=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("wmrl: error: anchors.fraction=0 with method='ppi'")
    assert not out.exists()
