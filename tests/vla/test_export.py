"""`wmrl export` of VLA runs: the exported policy and world model, loaded with their own
``from_pretrained`` (lerobot's for the ACT bridge), act and score exactly as the run's final ones."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from wmrl.cli import main as cli_main
from wmrl.config import load_config
from wmrl.export import MANIFEST, export_run, push_to_hub
from wmrl.trainer import Trainer
from wmrl_vla.domain import VLATask


def _train(tmp_path, root, name, *extra):
    cfg = load_config(
        "vla-debug",
        [
            f"--out_dir={tmp_path / name}",
            f"--domain.cache_dir={root / 'cache'}",  # the session's demos (and small-VLA SFT + WM)
            "--grpo.steps=2",
            "--grpo.lr=0.01",  # big enough that the final policy differs visibly from SFT
            "--domain.record_anchors=false",
            "--tracking.eval_every=2",
            *extra,
        ],
    )
    domain = cfg.domain.build(cfg)
    last = Trainer(cfg, domain).train()
    return cfg, domain, last


def _inputs(domain, n=6):
    """Real first observations of held-out seeds: ``[n, 3, H, W]`` uint8, ``[n, S]``, instruction ids."""
    obs = [domain._initial_obs(VLATask("wmrl/ReachColor-v0", 4000 + k, "test")) for k in range(n)]
    images = torch.from_numpy(np.stack([o[0] for o in obs]))
    states = torch.from_numpy(np.stack([o[1] for o in obs]))
    return images, states, [o[2] for o in obs]


@pytest.fixture(scope="module")
def small_vla_export(vla_debug, tmp_path_factory):
    _, _, root = vla_debug
    tmp = tmp_path_factory.mktemp("export")
    cfg, domain, last = _train(tmp, root, "run")
    out = tmp / "out"
    manifest = export_run(tmp / "run", out)
    yield domain, last, tmp / "run", out, manifest, cfg
    domain.close()


def test_exported_small_vla_acts_like_the_final_policy(small_vla_export):
    from wmrl_vla.demos import cache_key
    from wmrl_vla.pipeline import _policy_fields
    from wmrl_vla.policy import SmallVLA

    domain, _, _, out, _, cfg = small_vla_export
    loaded = SmallVLA.from_pretrained(str(out)).eval()
    final = domain.policy.eval()
    images, states, texts = _inputs(domain)
    ids = loaded.tokenizer.encode(texts)
    assert torch.equal(ids, final.tokenizer.encode(texts))
    with torch.no_grad():
        assert torch.equal(loaded(images, states, ids), final(images, states, ids))
        a = loaded.act(images, states, ids, 1.0, torch.Generator().manual_seed(3))
        b = final.act(images, states, ids, 1.0, torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))  # same bins, log-probs, actions
    # it is the final policy, not the SFT checkpoint the run started from
    sft = SmallVLA.load(Path(cfg.domain.cache_dir) / f"sft-{cache_key(_policy_fields(cfg.domain))}.pt")
    with torch.no_grad():
        assert not torch.equal(sft(images, states, ids), final(images, states, ids))


def test_exported_world_model_scores_like_the_runs(small_vla_export):
    from world_models.vla_dynamics import VLADynamics, instruction_ids

    domain, _, _, out, _, _ = small_vla_export
    loaded = VLADynamics.from_pretrained(str(out / "world_model")).eval()
    final = domain.world_model.model.eval()
    images, states, texts = _inputs(domain, 4)
    actions = torch.rand(4, 5, 4, generator=torch.Generator().manual_seed(0)) * 2 - 1
    mask, words = torch.ones(4, 5), instruction_ids(texts)
    with torch.no_grad():
        a, b = (
            loaded.score_actions(images, states, actions, mask, words),
            final.score_actions(images, states, actions, mask, words),
        )
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_model_card_and_manifest_carry_the_runs_figures(small_vla_export):
    _, last, run_dir, out, manifest, _ = small_vla_export
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: wmrl" in card
    assert f"**{int(last['exec/real_total'])} real executions**" in card
    assert "method `wmrl`" in card and (run_dir / "config.yaml").read_text().strip() in card
    assert f"| `eval/success` | {last['eval/success']:.4g} |" in card
    saved = json.loads((out / MANIFEST).read_text())
    assert saved["real_executions"] == last["exec/real_total"] == manifest["real_executions"]
    assert saved["figures"]["eval/reward"] == pytest.approx(last["eval/reward"])


def test_push_to_hub_dry_run_lists_every_file_with_its_hash(small_vla_export):
    out = small_vla_export[3]
    ops = push_to_hub(out, "someone/wmrl-vla", dry_run=True)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert [op.path_in_repo for op in ops] == files
    assert {"model.safetensors", "config.json", "README.md", "world_model/model.safetensors"} <= set(files)
    for op in ops:
        assert op.upload_info.sha256 == hashlib.sha256((out / op.path_in_repo).read_bytes()).digest()


def test_cli_export_refuses_a_used_folder_and_an_offline_push(small_vla_export, tmp_path, capsys):
    run_dir, out = small_vla_export[2], small_vla_export[3]
    assert cli_main(["export", str(run_dir), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    # HF_HUB_OFFLINE=1 (conftest): the real push fails with huggingface_hub's offline error, clearly
    new = tmp_path / "again"
    assert cli_main(["export", str(run_dir), "--out", str(new), "--push-to-hub", "someone/x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wmrl: error:") and "offline" in err.lower()
    assert (new / "model.safetensors").exists()


def test_act_bridge_exports_a_lerobot_folder_lerobots_from_pretrained_loads(vla_debug, tmp_path):
    from lerobot.policies.act.modeling_act import ACTPolicy
    from safetensors.torch import load_file

    _, _, root = vla_debug
    cfg, domain, _ = _train(tmp_path, root, "act", "--domain.policy=lerobot_act", "--tracking.eval_every=0")
    try:
        export_run(tmp_path / "act", tmp_path / "out")
        loaded = ACTPolicy.from_pretrained(str(tmp_path / "out")).eval()
        final = domain.policy.eval()
        images, states, _ = _inputs(domain, 4)
        with torch.no_grad():
            batch = {"observation.image": images.float() / 255.0, "observation.state": states}
            got = loaded.select_action(batch)  # lerobot's own inference path
            want = final.mean(images, states)
        assert torch.allclose(got, want, atol=1e-6, rtol=0), (got - want).abs().max()
        log_std = load_file(str(tmp_path / "out" / "gaussian_head.safetensors"))["log_std"]
        assert torch.equal(log_std, final.log_std.detach())
        assert (tmp_path / "out" / "world_model" / "model.safetensors").exists()
    finally:
        domain.close()
