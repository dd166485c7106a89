"""Every domain through the Domain contract (wmrl/domain.py): :func:`check_domain`, then one
generate / execute / score round with the shapes and types the trainer relies on; a domain that
breaks the contract is refused in one line before anything is written; a closed-loop domain's true
rewards reach the trainer without an execution job; the WM-row to real-row map is general.

The toy and the contract's unit tests run in seconds; the research, VLA and lerobot-env domains are
built small (the presets and fixtures their own tests use) and marked slow.
"""

import os

os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import dataclasses  # noqa: E402
import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from wmrl.config import DomainConfig, load_config, load_domains  # noqa: E402
from wmrl.device import module_device  # noqa: E402
from wmrl.domain import (  # noqa: E402
    DomainCapabilities,
    DomainConfigCapabilities,
    DomainContractError,
    Graded,
    Job,
    Prediction,
    RolloutBatch,
    check_domain,
    check_domain_config,
)
from wmrl.ppi import ppi_rows  # noqa: E402
from wmrl.toy import ToyConfig, ToyDomain  # noqa: E402
from wmrl.trainer import Trainer  # noqa: E402

G, TASKS = 2, 2


def contract_round(domain) -> tuple[DomainCapabilities, RolloutBatch, torch.Tensor]:
    """Check ``domain``, then one round of the trainer's step done by hand: sample, generate with the
    first group an anchor, true rewards of the anchor rows (closed loop or jobs), WM scores and one
    refinement, the policy's re-scoring, state round trip. Returns the capabilities, the batch and
    the anchor rows' true rewards."""
    caps = check_domain(domain)
    assert caps == DomainCapabilities.of(domain)
    tasks = domain.sample_tasks(TASKS, "train", torch.Generator().manual_seed(0))
    assert isinstance(tasks, list) and len(tasks) == TASKS
    anchors = torch.tensor([True] + [False] * (TASKS - 1))
    batch = domain.generate(tasks, G, anchors)

    assert isinstance(batch, RolloutBatch)
    n, t = batch.tokens.shape
    assert batch.tokens.dtype == torch.long and batch.logprobs.is_floating_point()
    assert batch.logprobs.shape == batch.mask.shape == (n, t)
    assert set(batch.mask.unique().tolist()) <= {0.0, 1.0} and bool((batch.mask.sum(1) > 0).all())
    assert batch.group_ids.dtype == torch.long and batch.group_ids.shape == (n,)
    assert (
        n == batch.n_groups * G
        and batch.group_ids.tolist() == torch.arange(batch.n_groups).repeat_interleave(G).tolist()
    )
    assert batch.n_groups >= TASKS and all(a is b or a == b for a, b in zip(batch.tasks, tasks, strict=False))
    assert all(v.shape[0] == n for v in batch.extras.values())
    assert not batch.payload or len(batch.payload) == n
    anchor_rows = torch.arange(G)  # group 0
    if batch.real_row is not None:  # twins: WM-only rows standing for real rows of anchor groups
        stands_in = batch.real_row >= 0
        assert bool((batch.group_ids[stands_in] >= TASKS).all())
        assert bool(anchors[batch.group_ids[batch.real_row[stands_in]]].all())

    # the policy re-scores the tokens it sampled (the ratio starts at 1)
    with torch.no_grad():
        lp = domain.policy.log_probs(batch.to(module_device(domain.policy))).cpu()
    m = batch.mask.bool()
    assert lp.shape == (n, t) and torch.allclose(lp[m].float(), batch.logprobs[m].float(), atol=1e-3)

    # true rewards: the closed loop's, else one execution job per anchor row
    r_true = torch.full((len(anchor_rows),), math.nan)
    if batch.real_rewards is not None:
        assert batch.real_rewards.shape == (n,)
        r_true = batch.real_rewards[anchor_rows].float()
    todo = anchor_rows[r_true.isnan()]
    if todo.numel():
        jobs = domain.execution_jobs(batch, todo.tolist())
        assert len(jobs) == todo.numel() and all(isinstance(j, Job) and callable(j.fn) for j in jobs)
        values = [j.fn(*j.args) for j in jobs]
        assert all(isinstance(v, (float, int, Graded)) for v in values), values
        graded = [v for v in values if isinstance(v, Graded)]
        r_true[r_true.isnan()] = torch.tensor(
            [float(v.reward if isinstance(v, Graded) else v) for v in values]
        )
        if graded and caps.execution_outcomes is not None:  # as the trainer hands them over
            caps.execution_outcomes([str(v.outcome) for v in graded])
    assert bool(r_true.isfinite().all()), r_true

    pred = domain.world_model.predict(batch)
    assert isinstance(pred, Prediction) and pred.mean.shape == (n,)
    assert pred.var is None or (pred.var.shape == (n,) and bool((pred.var[pred.var.isfinite()] >= 0).all()))
    out = domain.world_model.update(batch, anchor_rows, r_true) or {}
    assert all(isinstance(k, str) and isinstance(float(v), float) for k, v in out.items())
    oracle = domain.oracle_rewards(batch)
    assert oracle is None or oracle.shape == (n,)
    if caps.step_metrics is not None:
        assert all(isinstance(k, str) and math.isfinite(float(v)) for k, v in caps.step_metrics().items())
    domain.load_state_dict(domain.state_dict())
    return caps, batch, r_true


# ---- the toy (fast) ------------------------------------------------------------------------------
@pytest.mark.parametrize("twins", [False, True])
def test_the_toy_keeps_the_contract(twins):
    cfg = load_config(
        "toy", ["--method=ppi", "--ppi.prior_from_log=true", f"--domain.twin_anchors={str(twins).lower()}"]
    )
    domain = cfg.domain.build(cfg)
    caps, batch, r_true = contract_round(domain)
    assert caps.shard_rng is not None and caps.rollout_media is not None and caps.executor is None
    groups = caps.prior_anchor_groups()  # a declared method, not an attribute set after the build
    assert len(groups) == cfg.domain.log_groups and all(
        len(h) == len(r) == cfg.grpo.group_size for h, r in groups
    )
    assert torch.equal(r_true, domain.oracle_rewards(batch)[:G])  # the jobs return the true rewards
    if twins:  # the twin rows stand for the anchor group's rows, one to one, with the same action
        assert batch.real_row.tolist() == [-1] * (TASKS * G) + list(range(G))
        assert torch.equal(batch.tokens[TASKS * G :], batch.tokens[:G])


# ---- refusals ------------------------------------------------------------------------------------
class Without:
    """A toy domain lacking one member."""

    def __init__(self, missing: str):
        self._inner, self._missing = ToyDomain(ToyConfig(), seed=0), missing

    def __getattr__(self, name):
        if name == self._missing:
            raise AttributeError(name)
        return getattr(self._inner, name)


def _refusal(domain) -> str:
    with pytest.raises(DomainContractError) as e:
        check_domain(domain)
    message = str(e.value)
    assert len(message.splitlines()) == 1 and message.endswith("(the Domain contract, wmrl/domain.py)")
    return message


def test_a_domain_without_a_required_member_is_refused_in_one_line():
    assert _refusal(Without("generate")).startswith(
        "domain Without has no generate(tasks, group_size, anchor_groups)"
    )
    assert _refusal(Without("world_model")).startswith("domain Without has no world_model")
    assert _refusal(Without("load_state_dict")).startswith("domain Without has no load_state_dict(state)")


def test_members_of_the_wrong_kind_are_refused_in_one_line():
    def toy(**members):
        domain = ToyDomain(ToyConfig(), seed=0)
        for k, v in members.items():
            setattr(domain, k, v)
        return domain

    cases = {
        "has shard_rng, but it is not a method taking shard_rng(rank, step)": toy(shard_rng=lambda: None),
        "has evaluate, but it is not a method taking evaluate(split)": toy(evaluate="eval"),
        "has extras_padding {'prompt_ids': ('up', 0)}, not a dict of key -> ('left' | 'right', value)": toy(
            extras_padding={"prompt_ids": ("up", 0)}
        ),
        "has bf16_unsupported True, not a str saying why": toy(bf16_unsupported=True),
        "has executor object, not an executor with run, cancel and close": toy(executor=object()),
        "has policy Linear, not a torch.nn.Module with log_probs(batch)": toy(policy=torch.nn.Linear(2, 2)),
        "has world_model ToyDomain without predict(batch)": toy(world_model=ToyDomain(ToyConfig(), seed=0)),
        "has prior_anchor_groups, but it is not a method taking prior_anchor_groups()": toy(
            prior_anchor_groups=[([0.5], [1.0])]
        ),
    }
    for want, domain in cases.items():
        assert _refusal(domain) == f"domain ToyDomain {want} (the Domain contract, wmrl/domain.py)"


def test_the_trainer_refuses_a_broken_domain_before_writing_anything(tmp_path):
    cfg = load_config("toy", [f"--out_dir={tmp_path / 'run'}", "--tracking.wandb=disabled"])
    with pytest.raises(DomainContractError, match="domain Without has no execution_jobs"):
        Trainer(cfg, Without("execution_jobs"))
    assert not (tmp_path / "run").exists()


# ---- closed loop and the row map -----------------------------------------------------------------
class ClosedLoopToy(ToyDomain):
    """The toy as a closed-loop domain: its anchor rows come back with their true rewards, and it
    has no execution to offer."""

    def generate(self, tasks, group_size, anchor_groups):
        batch = super().generate(tasks, group_size, anchor_groups)
        real = anchor_groups.repeat_interleave(group_size)
        batch.real_rewards = torch.where(
            real, self.oracle_rewards(batch), torch.full((batch.n_rollouts,), math.nan)
        )
        return batch

    def execution_jobs(self, batch, indices):
        raise AssertionError("a closed-loop domain's rewards need no execution job")


def test_a_closed_loop_domains_rewards_reach_the_trainer_without_an_execution_job(tmp_path):
    overrides = [f"--out_dir={tmp_path / 'run'}", "--tracking.wandb=disabled", "--method=wmrl"]
    cfg = load_config("toy", overrides)
    closed = Trainer(cfg, ClosedLoopToy(cfg.domain, seed=cfg.seed, group_size=cfg.grpo.group_size))
    cfg2 = load_config("toy", [*overrides[1:], f"--out_dir={tmp_path / 'jobs'}"])
    jobs = Trainer(cfg2, cfg2.domain.build(cfg2))
    for _ in range(2):  # the same draws: the same true rewards, whichever path they took
        a, b = closed.train_step(), jobs.train_step()
        assert a["exec/step"] == b["exec/step"] > 0 and a["exec/ungraded"] == 0
        assert a["reward/anchor_true"] == b["reward/anchor_true"]
    assert torch.equal(closed.policy.theta, jobs.policy.theta)


# ---- what a domain's config declares -------------------------------------------------------------
def test_every_registered_domain_config_declares_its_margin_name_and_hooks():
    """The built-in domains' configs, as the core reads them through check_domain_config: each its
    margin and name for people; the research and VLA configs their export and data-parallel SFT
    hooks (called by `wmrl export` and a data-parallel run), the toy neither; research alone starts
    each seed from its own policy."""
    want = {  # type -> (margin, display name, has hooks, start per seed)
        "toy": (0.005, "toy", False, False),
        "research": (0.02, "AutoResearch agent", True, True),
        "vla": (0.01, "VLA", True, False),
    }
    known = load_domains()
    assert set(want) <= set(known)
    for kind, (margin, name, hooks, per_seed) in want.items():
        declared = check_domain_config(DomainConfig.get_choice_class(kind)())
        assert (declared.margin, declared.display_name, declared.start_per_seed) == (
            margin,
            name,
            per_seed,
        ), kind
        assert (declared.export is not None, declared.sft_data_parallel is not None) == (hooks, hooks), kind
    for kind in set(known) - {"toy_bad_margin"}:  # every other registered one, tests' toys included
        check_domain_config(DomainConfig.get_choice_class(kind)())


def test_a_domain_config_declaring_the_wrong_kind_is_refused_in_one_line():
    def toy(**members):
        cfg = ToyConfig()
        for k, v in members.items():
            object.__setattr__(cfg, k, v)
        return cfg

    cases = {
        "has NONINFERIORITY_MARGIN -0.1, not a number >= 0": toy(NONINFERIORITY_MARGIN=-0.1),
        "has NONINFERIORITY_MARGIN '0.01', not a number >= 0": toy(NONINFERIORITY_MARGIN="0.01"),
        "has DISPLAY_NAME '', not a non-empty str": toy(DISPLAY_NAME=""),
        "has START_PER_SEED 'yes', not a bool": toy(START_PER_SEED="yes"),
        "has export, but it is not a method taking export(run, state, out)": toy(export=lambda run: {}),
        "has sft_data_parallel, but it is not a method taking sft_data_parallel(run, accelerator)": toy(
            sft_data_parallel="sft"
        ),
    }
    for want, cfg in cases.items():
        with pytest.raises(DomainContractError) as e:
            check_domain_config(cfg)
        assert str(e.value) == f"domain config ToyConfig {want} (the Domain contract, wmrl/domain.py)"
    undeclared = type("Undeclared", (DomainConfig,), {})()  # declares nothing: every field its default
    assert check_domain_config(undeclared) == DomainConfigCapabilities()


@DomainConfig.register_subclass("toy_bad_margin")
@dataclasses.dataclass
class BadMarginToy(ToyConfig):
    NONINFERIORITY_MARGIN = -1


def test_a_run_of_a_domain_config_declaring_the_wrong_kind_is_refused_before_writing_anything(tmp_path):
    from wmrl.runs import train_run

    cfg = load_config("toy", [f"--out_dir={tmp_path / 'run'}", "--tracking.wandb=disabled"])
    cfg.domain = BadMarginToy()
    with pytest.raises(DomainContractError, match="domain config BadMarginToy has NONINFERIORITY_MARGIN -1"):
        train_run(cfg)
    assert not (tmp_path / "run").exists()


def test_the_row_map_needs_no_group_layout():
    """Twin rows stand for real rows by row, not by group: the batch's rows shuffled (groups no
    longer contiguous, the map carried along) give every row the same ppi advantage."""
    g = torch.Generator().manual_seed(0)
    n_tasks, size = 3, 4
    gid = torch.arange(n_tasks + 1).repeat_interleave(size)  # group 3: the twins of group 0
    real_row = torch.cat([torch.full((n_tasks * size,), -1), torch.arange(size)])
    r_true = torch.cat([torch.rand(size, generator=g), torch.full((len(gid) - size,), math.nan)])
    r_wm = torch.rand(len(gid), generator=g)
    group_anchor = torch.tensor([True, False, False, False])
    want = ppi_rows(r_true, r_wm, gid, group_anchor, real_row, n_tasks, 0.7)
    perm = torch.randperm(len(gid), generator=g)
    new_pos = torch.empty_like(perm)
    new_pos[perm] = torch.arange(len(perm))
    moved = torch.where(real_row[perm] >= 0, new_pos[real_row[perm].clamp(min=0)], -1)
    got = ppi_rows(r_true[perm], r_wm[perm], gid[perm], group_anchor, moved, n_tasks, 0.7)
    assert torch.allclose(got.adv, want.adv[perm]) and torch.equal(got.used, want.used[perm])
    assert torch.equal(got.counted, want.counted[perm]) and torch.equal(got.pair, new_pos[want.pair[perm]])


# ---- the research, VLA and lerobot-env domains (slow: each builds a small domain) --------------------
@pytest.mark.slow
def test_the_research_domain_keeps_the_contract(tmp_path_factory):
    root = tmp_path_factory.mktemp("research")
    cfg = load_config(
        "research-debug",
        [f"--domain.cache_dir={root / 'cache'}", f"--out_dir={root / 'run'}", "--domain.sft_steps=10",
         "--domain.wm_pretrain_steps=20"],
    )  # fmt: skip
    domain = cfg.domain.build(cfg)
    try:
        caps, batch, _ = contract_round(domain)
        assert caps.executor is domain.executor and caps.worker_initializer is not None
        assert set(caps.extras_padding) <= set(batch.extras) and batch.real_rewards is None
        assert caps.prior_anchor_groups() is None  # built for wmrl, not ppi.prior_from_log
        # the anchor rows' executions were counted by sandbox outcome (one per row)
        assert sum(v for k, v in caps.step_metrics().items() if k.startswith("exec_")) == G
    finally:
        domain.close()


def _vla_round(domain):
    """The VLA contract round: the anchor group rolled out in the simulator returns its rewards
    (the closed loop), equal to a second real execution of its recorded actions."""
    caps, batch, r_true = contract_round(domain)
    assert caps.close is not None and caps.shard_rng is not None
    assert torch.equal(
        r_true, torch.tensor([batch.payload[i]["reward"] for i in range(G)], dtype=torch.float32)
    )
    assert bool(batch.real_rewards[G:].isnan().all())  # imagined rows: no true reward
    for i, job in enumerate(domain.execution_jobs(batch, list(range(G)))):
        assert job.fn(*job.args) == pytest.approx(float(r_true[i]), abs=1e-6)
    return caps


@pytest.mark.slow
def test_the_vla_domain_keeps_the_contract(vla_debug):
    _, domain, _ = vla_debug
    caps = _vla_round(domain)
    assert caps.bf16_unsupported is None  # the small VLA runs under bf16


@pytest.mark.slow
def test_the_lerobot_env_domain_keeps_the_contract(tmp_path_factory):
    """As tests/vla/test_lerobot_workflow.py builds it: lerobot's MetaWorld env, a tiny ACT trained
    by lerobot on demos recorded there, post-trained from its `pretrained_model` folder."""
    from wmrl_vla.data import record_demos
    from wmrl_vla.lerobot_env import LeRobotEnvConfig, register_task
    from wmrl_vla.lerobot_policy import train_act

    task, size, steps = "reach-v3", 32, 60
    root = tmp_path_factory.mktemp("lerobot_user")
    task_id = register_task(LeRobotEnvConfig(type="metaworld", task=task, episode_length=steps))
    record_demos([task_id], 2, root / "data", "user/reach", image_size=size, seed=100, max_steps=steps)
    folder = train_act(
        root / "data", "user/reach", root / "train", steps=2, dim_model=32, n_heads=2, dim_feedforward=64,
        n_encoder_layers=1, n_decoder_layers=1, n_vae_encoder_layers=1, latent_dim=8, chunk_size=5,
        n_action_steps=5,
    )  # fmt: skip
    cfg = load_config(
        "vla-debug",
        [f"--out_dir={root / 'run'}", "--domain.env.type=metaworld", f"--domain.env.task={task}",
         f"--domain.env.episode_length={steps}", "--domain.max_steps=null", f"--domain.image_size={size}",
         f"--domain.policy_path={folder}", f"--domain.dataset_root={root / 'data'}",
         f"--domain.cache_dir={root / 'cache'}", "--domain.wm_policy_rollouts_per_task=1",
         "--domain.record_anchors=false"],
    )  # fmt: skip
    domain = cfg.domain.build(cfg)
    try:
        caps = _vla_round(domain)
        assert (
            caps.bf16_unsupported == f"domain.policy_path={folder} (a lerobot policy) is run in float32 only"
        )
    finally:
        domain.close()
