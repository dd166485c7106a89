"""The research outcome WMs (wmrl_research/wm_kinds.py): --domain.world_model selects a registered class."""

from __future__ import annotations

import pytest

from wmrl.config import RunConfig
from wmrl_research.config import WORLD_MODELS, ResearchConfig
from wmrl_research.wm_kinds import WM_KINDS, wm_kind


def test_every_world_model_choice_is_a_registered_kind():
    assert WORLD_MODELS == tuple(WM_KINDS) == ("surrogate", "surrogate_hgb", "code", "encoder", "lm")
    assert {w: wm_kind(ResearchConfig(world_model=w)).name for w in WORLD_MODELS} == {
        w: w for w in WORLD_MODELS
    }
    assert [w for w in WORLD_MODELS if WM_KINDS[w].full_state] == ["surrogate", "surrogate_hgb", "code"]


def test_the_surrogate_kinds_differ_in_their_estimator_and_text_kinds_need_a_tokenizer():
    run = RunConfig(seed=0)
    est = {
        w: wm_kind(ResearchConfig(world_model=w)).build(run).estimator for w in ("surrogate", "surrogate_hgb")
    }
    assert est == {"surrogate": "extra_trees", "surrogate_hgb": "hgb"}
    with pytest.raises(ValueError, match="world_model='encoder' needs the policy's tokenizer"):
        wm_kind(ResearchConfig(world_model="encoder")).build(run)


def test_a_kind_without_an_export_says_so_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="cannot write a domain.world_model=code WM yet"):
        wm_kind(ResearchConfig(world_model="code")).export(None, {}, RunConfig(seed=0), [], tmp_path)
