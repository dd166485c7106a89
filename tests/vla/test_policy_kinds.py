"""The VLA policy kinds (wmrl_vla/policies/): --domain.policy selects a registered class that owns the
kind's cache key, network, flags and export; unknown names list the registered ones."""

from __future__ import annotations

import pytest

from wmrl.config import ConfigError, load_config
from wmrl_vla.config import POLICIES, VLAEvaluation, VLAWMRefinement
from wmrl_vla.policies import POLICY_KINDS, policy_kind


def domain(*overrides: str):
    return load_config("vla-debug", list(overrides)).domain


def test_every_policy_choice_is_a_registered_kind_with_its_flags():
    assert (
        POLICIES
        == tuple(POLICY_KINDS)
        == ("small_vla", "lerobot_act", "lerobot_smolvla", "lerobot_diffusion", "lerobot_smolvla_chain")
    )
    kinds = {p: policy_kind(domain(f"--domain.policy={p}")) for p in POLICIES}
    assert {p: k.name for p, k in kinds.items()} == {p: p for p in POLICIES}
    assert [p for p, k in kinds.items() if k.lerobot] == [
        "lerobot_act",
        "lerobot_smolvla",
        "lerobot_diffusion",
        "lerobot_smolvla_chain",
    ]
    assert [p for p, k in kinds.items() if k.export_refused] == ["lerobot_diffusion", "lerobot_smolvla_chain"]
    assert [p for p, k in kinds.items() if k.records_chain] == ["lerobot_diffusion", "lerobot_smolvla_chain"]
    assert {p: k.folder_type for p, k in kinds.items() if k.folder_type} == {"lerobot_diffusion": "diffusion"}
    assert [p for p, k in kinds.items() if k.reads_latent] == ["small_vla"]
    assert [p for p, k in kinds.items() if k.sft_data_parallel] == ["small_vla"]
    assert domain().bf16_unsupported() is None
    assert domain("--domain.policy=lerobot_act").bf16_unsupported() == (
        "domain.policy=lerobot_act (a lerobot policy) is run in float32 only"
    )
    with pytest.raises(
        ConfigError,
        match="domain.policy='act' is not one of small_vla, lerobot_act, lerobot_smolvla, lerobot_diffusion, lerobot_smolvla_chain",
    ):
        domain("--domain.policy=act")
    with pytest.raises(ConfigError, match="imagine_input=latent needs domain.policy=small_vla"):
        domain("--domain.policy=lerobot_act", "--domain.imagine_input=latent")


def test_only_the_small_vla_keys_its_sft_cache_on_its_own_sft_fields():
    extras = ["--domain.sft_shift=2", "--domain.dagger_rounds=1", "--domain.locator=false"]
    small = policy_kind(domain(*extras)).cache_fields()
    assert small["sft_shift"] == 2 and small["dagger_rounds"] == 1 and small["locator"] is False
    plain = domain("--domain.sft_shift=0", "--domain.sft_aux_goal=0", "--domain.locator=true")
    assert not {"sft_shift", "sft_aux_goal", "locator", "dagger_rounds"} & set(
        policy_kind(plain).cache_fields()
    )
    act = policy_kind(domain("--domain.policy=lerobot_act", *extras)).cache_fields()
    assert act == policy_kind(domain("--domain.policy=lerobot_act")).cache_fields()


def test_the_small_vla_kind_builds_the_configured_network():
    cfg = domain("--domain.d_model=32", "--domain.n_bins=11", "--domain.locator=false")
    net = policy_kind(cfg).build()
    assert (net.cfg.d_model, net.cfg.n_bins, net.cfg.locator, net.cfg.image_size) == (
        32,
        11,
        False,
        cfg.image_size,
    )


def test_the_diffusion_kind_builds_a_chain_policy_of_the_task_dims_and_refuses_export(tmp_path):
    from wmrl_vla.demos import task_dims
    from wmrl_vla.export import export_vla

    cfg = load_config("vla-debug", ["--domain.policy=lerobot_diffusion"])
    net = policy_kind(cfg.domain).build()
    state_dim, action_dim = task_dims(cfg.domain.tasks)
    assert (net.bridge_config.image_size, net.bridge_config.state_dim, net.bridge_config.action_dim) == (
        cfg.domain.image_size,
        state_dim,
        action_dim,
    )
    assert net.records_chain and policy_kind(cfg.domain).records_chain
    assert policy_kind(cfg.domain).words() == "the SFT policy"
    with pytest.raises(ValueError, match="wmrl export does not write a post-trained diffusion policy yet"):
        export_vla(cfg.domain, cfg, {}, tmp_path)  # refused before any weight is read


def test_the_flat_eval_fields_are_the_domains_evaluation():
    cfg = domain(
        "--domain.eval_episodes_per_task=3", "--domain.eval_combos=train", "--domain.eval_temperature=0",
        "--domain.eval_sampled=true", "--domain.eval_lockstep=5", "--domain.n_videos=1",
    )  # fmt: skip
    assert cfg.evaluation == VLAEvaluation(
        temperature=0.0, sampled=True, episodes_per_task=3, combos="train", lockstep=5, n_videos=1
    )


def test_the_flat_wm_refinement_fields_are_the_world_models_refinement():
    cfg = domain(
        "--domain.wm_update_steps=7", "--domain.wm_update_lr=0.01", "--domain.wm_batch_size=5",
        "--domain.wm_horizon=3", "--domain.wm_state_horizon=9", "--domain.wm_calibrate=false",
    )  # fmt: skip
    assert cfg.wm_refinement == VLAWMRefinement(
        update_steps=7, lr=0.01, batch_size=5, horizon=3, state_horizon=9, calibrate=False
    )


def test_the_smolvla_chain_kind_resolves_and_refuses_export(tmp_path):
    from wmrl_vla.export import export_vla
    from wmrl_vla.policies.lerobot_smolvla_chain import LeRobotSmolVLAChain
    from wmrl_vla.smolvla_bridge import SmolVLAFlowChainPolicy

    cfg = load_config("vla-debug", ["--domain.policy=lerobot_smolvla_chain"])
    kind = policy_kind(cfg.domain)
    assert isinstance(kind, LeRobotSmolVLAChain) and kind.policy_class() is SmolVLAFlowChainPolicy
    with pytest.raises(ValueError, match="wmrl export does not write a post-trained SmolVLA flow chain yet"):
        export_vla(cfg.domain, cfg, {}, tmp_path)  # refused before any weight is read


@pytest.mark.parametrize("policy", ["lerobot_diffusion", "lerobot_smolvla_chain"])
def test_a_chain_policy_refuses_ppis_twin_anchors_before_building_anything(policy, tmp_path):
    """A denoising chain cannot share ppi's common random numbers: one line before any demo, SFT or
    world model is built; other methods ignore domain.twin_anchors."""
    from wmrl_vla.pipeline import build_domain

    over = [f"--domain.cache_dir={tmp_path}", f"--domain.policy={policy}", "--domain.twin_anchors=true"]
    cfg = load_config("vla-debug", ["--method=ppi", *over])
    with pytest.raises(
        ConfigError,
        match=f"^domain.policy={policy} acts by a denoising chain, which cannot share method=ppi's common "
        r"random numbers \(domain.twin_anchors=true\); set --domain.twin_anchors=false$",
    ):
        build_domain(cfg.domain, cfg)
    assert not any(tmp_path.iterdir())


def test_the_chain_settings_are_checked_and_key_the_rollouts_not_the_clone():
    """``domain.chain`` is refused in one line for a policy that is not a chunked chain, for an unknown
    scoring, and beyond the policy's horizon (when it is built); the clone (SFT cache) is shared by
    every chain setting, the policy's recorded rollouts (and the WM built on them) are not."""
    from wmrl_vla.pipeline import _policy_fields, _rollout_fields

    with pytest.raises(
        ConfigError, match=r"^domain.chain applies to domain.policy=lerobot_diffusion .* not small_vla"
    ):
        domain("--domain.chain.act_steps=2")
    with pytest.raises(
        ConfigError, match=r"^domain.chain.scoring='marginal' is not one of joint, executed_marginal"
    ):
        domain("--domain.policy=lerobot_diffusion", "--domain.chain.scoring=marginal")
    with pytest.raises(
        ConfigError, match=r"^domain.chain.act_steps=9 must be 1..4 \(the policy's chunk horizon\)$"
    ):
        policy_kind(domain("--domain.policy=lerobot_diffusion", "--domain.chain.act_steps=9")).build()
    plain = domain("--domain.policy=lerobot_diffusion")
    chunked = domain("--domain.policy=lerobot_diffusion", "--domain.chain.act_steps=2")
    assert policy_kind(chunked).build().act_steps == 2
    assert _policy_fields(chunked) == _policy_fields(plain) and "chain" not in _rollout_fields(plain)
    assert _rollout_fields(chunked) == {
        **_rollout_fields(plain),
        "chain": {"act_steps": 2, "scoring": "joint", "ft_denoising_steps": None},
    }
