"""The core of `wmrl export` (no domain): clear refusals, and the model card's figures."""

from wmrl.cli import main
from wmrl.export import model_card

FAST = ["--executor.type=inline", "--tracking.wandb=disabled", "--tracking.progress=false",
        "--grpo.steps=2", "--grpo.tasks_per_step=4"]  # fmt: skip


def test_export_refusals_are_one_clear_line(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    run, preset = tmp_path / "run", tmp_path / "p.yaml"
    preset.write_text("domain: {type: toy}\ntracking: {eval_every: 0}\n")
    assert main(["run", str(preset), "--out-dir", str(run), *FAST]) == 0
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(tmp_path / "o")]) == 2
    assert "domain 'toy' has no export" in capsys.readouterr().err
    assert main(["export", str(run), "--out", str(tmp_path / "o"), "--dry-run"]) == 2
    assert "--dry-run goes with --push-to-hub" in capsys.readouterr().err
    assert main(["export", str(run), "--out", str(tmp_path / "o"), "--private"]) == 2
    assert "--private goes with --push-to-hub" in capsys.readouterr().err


def test_model_card_tables_held_out_figures_against_the_start():
    manifest = {
        "domain": "vla", "method": "wmrl", "seed": 3, "step": 20, "real_executions": 480,
        "figures": {"eval/success": 0.6, "start/eval/success": 0.5, "exec/real_total": 480.0,
                    "eval/sim_steps_train": 999.0},
        "policy": {"library": "wmrl", "load": "LOAD-SNIPPET", "files": ["model.safetensors"]},
        "tags": ["robotics"],
        "training": {"steps": 20, "tasks_per_step": 8, "group_size": 4, "anchor_fraction": 0.25,
                     "optimizer": "adamw", "lr": 1e-4, "kl_coef": 0.0, "precision": "bf16"},
    }  # fmt: skip
    card = model_card(manifest, "method: wmrl\n")
    assert card.startswith("---\n") and "- robotics" in card and "library_name: wmrl" in card
    assert "| `eval/success` | 0.6 | 0.5 |" in card
    assert "`eval/sim_steps_train` = 999" in card  # a training cost, not a held-out figure
    assert "**480 real executions**" in card and "LOAD-SNIPPET" in card and "method: wmrl" in card
    assert "`wmrl`: anchor groups executed for real (advantages weighted by w)" in card
    assert "20 steps of 8 tasks x 4 rollouts; anchor fraction 0.25; adamw lr 0.0001" in card
    assert "precision bf16" in card
