"""Anchor counts: one formula, and no count that a method would silently reinterpret."""

import pytest
import torch

from wmrl.anchors import inclusion_probabilities
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


# ---- the WM-guided choice's inclusion probabilities ------------------------------------------


def test_inclusion_probabilities_follow_the_need_capped_at_one_and_floored():
    need = torch.tensor([0.0, 0.0, 1.0, 1.0, 2.0, 100.0])
    pi = inclusion_probabilities(need, k=3, floor=0.0)
    assert pi.sum().item() == pytest.approx(3.0)
    assert pi[5].item() == pytest.approx(1.0)  # capped, the rest shared in proportion to need
    assert pi[2:5].tolist() == pytest.approx([0.5, 0.5, 1.0])
    assert pi[:2].tolist() == [0.0, 0.0]
    floored = inclusion_probabilities(need, k=3, floor=0.2)
    assert floored.sum().item() == pytest.approx(3.0)
    assert floored.min().item() == pytest.approx(0.2 * 3 / 6)  # HT weights bounded by N / (floor k)
    assert torch.allclose(floored, 0.8 * pi + 0.2 * 0.5)


def test_inclusion_probabilities_are_uniform_without_need_or_at_floor_one():
    uniform = torch.full((8,), 0.25, dtype=torch.float64)
    assert torch.allclose(inclusion_probabilities(torch.zeros(8), 2, 0.0), uniform)
    assert torch.allclose(inclusion_probabilities(torch.rand(8), 2, 1.0), uniform)
    # fewer groups with need than anchors: the needy ones are certain, the rest share what is left
    pi = inclusion_probabilities(torch.tensor([1.0, 0, 0, 0]), 2, 0.0)
    assert pi.tolist() == pytest.approx([1.0, 1 / 3, 1 / 3, 1 / 3])


@pytest.mark.parametrize(
    ("need", "k", "floor"),
    [
        (torch.ones(4), 0, 0.1),
        (torch.ones(4), 5, 0.1),
        (torch.ones(4), 2, 1.5),
        (torch.tensor([1.0, -1, 0, 0]), 2, 0.1),
    ],
)
def test_inclusion_probabilities_refuse_bad_input(need, k, floor):
    with pytest.raises(ValueError):
        inclusion_probabilities(need, k, floor)
