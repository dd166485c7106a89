"""Any MetaWorld v3 task by its id alone (not only the listed MT10), MetaWorld's expert as demonstrator."""

from __future__ import annotations

import numpy as np
import pytest

import sims
from sims.registry import TASKS, metaworld_names
from wmrl.config import ConfigError
from wmrl_vla.config import VLAConfig

TASK = "wmrl/MetaWorld-dial-turn-v3"  # not in MT10, so not in the listed TASKS


def test_unlisted_metaworld_task_builds_and_its_expert_succeeds():
    assert TASK not in TASKS
    info = sims.task_info(TASK)
    assert info["source"] == "metaworld" and (info["action_dim"], info["state_dim"]) == (4, 7)
    env = sims.make(TASK, render=False)
    act = sims.expert_for(env)
    try:
        obs, inf = env.reset(seed=1)
        assert inf["instruction"] == "dial turn" and env.max_steps == info["max_steps"]
        first = obs["state"].copy()
        done = False
        while not done:
            obs, reward, term, trunc, inf = env.step(act(obs, inf))
            done = term or trunc
        assert inf["success"] and term and reward == 1.0 and inf["step"] < env.max_steps
        np.testing.assert_array_equal(env.reset(seed=1)[0]["state"], first)  # seeded reset
    finally:
        env.close()


def test_every_metaworld_v3_task_resolves_and_is_listed():
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    names = metaworld_names()
    assert names == tuple(sorted(ALL_V3_ENVIRONMENTS))  # the listed names are the installed MetaWorld's
    assert len(names) == 50 and "dial-turn-v3" in names
    ids = {line.split("\t")[0] for line in sims.task_lines(all_metaworld=True)}
    assert {f"wmrl/MetaWorld-{n}" for n in names} <= ids
    assert all(sims.task_info(f"wmrl/MetaWorld-{n}")["has_expert"] for n in names)


def test_unknown_metaworld_name_lists_close_names():
    with pytest.raises(KeyError, match="close: wmrl/MetaWorld-dial-turn-v3"):
        sims.make("wmrl/MetaWorld-dial-trun-v3")
    with pytest.raises(
        ConfigError, match="did you mean 'wmrl/MetaWorld-sweep-into-v3'.*close: .*wmrl/MetaWorld-sweep-v3"
    ):
        VLAConfig(tasks=["wmrl/MetaWorld-sweep-into-v2"])
    assert VLAConfig(tasks=[TASK, "wmrl/MetaWorld-reach-v3"]).tasks == [TASK, "wmrl/MetaWorld-reach-v3"]
