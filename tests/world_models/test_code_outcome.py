"""The code-reading outcome WM: ranks code edits by what their text says, widens its variance off the
data it has seen, and is the knob surrogate on knob edits."""

import itertools
import random

import numpy as np
import pytest
import torch

from wmrl_research.diagnose import within_group_stats
from world_models.code_outcome import CodeOutcomeModel, MiniLMEmbedder, split_edit, token_codes
from world_models.knob_surrogate import KnobSurrogateOutcomeModel
from world_models.outcome import OutcomeExample

TASK = "toy_cls | classification | accuracy"
TASKS = {TASK: ({"LR": ["0.1", "0.01", "0.001"]}, {"LR": "0.1"})}
ACTIVATIONS = {"ReLU": 0.8, "GELU": 0.7, "Tanh": 0.35, "Sigmoid": 0.1}
EPOCHS = {1: -0.2, 3: 0.0, 10: 0.1, 30: 0.15}


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return MiniLMEmbedder(tmp_path_factory.mktemp("minilm"))


def _text(lr: str, act: str, epochs: int, dropped: bool) -> str:
    out = f"LR = {lr}\n-    layers = [nn.Linear(4, 8), nn.ReLU()]\n+    layers = [nn.Linear(4, 8), nn.{act}()]\n"
    out += f"-    for _ in range(3):\n+    for _ in range({epochs}):\n"
    if dropped:
        out += "-    opt.step()\n+    pass\n"
    return out


def _reward(act: str, epochs: int, dropped: bool) -> float:
    return -1.0 if dropped else ACTIVATIONS[act] + EPOCHS[epochs]


def _examples(cells):
    return [
        OutcomeExample("toy", TASK, _text(lr, a, e, d), _reward(a, e, d), "ok", "code")
        for lr, a, e, d in cells
    ]


def test_split_edit_separates_removed_added_and_knob_lines():
    removed, added, code = split_edit(_text("0.1", "Tanh", 10, True))
    assert removed.splitlines() == [
        "layers = [nn.Linear(4, 8), nn.ReLU()]",
        "for _ in range(3):",
        "opt.step()",
    ]
    assert added.splitlines() == ["layers = [nn.Linear(4, 8), nn.Tanh()]", "for _ in range(10):", "pass"]
    assert code
    assert split_edit("LR = 0.01\n") == ("", "", False)
    # token codes: the same tokens, the same code; a different token, a different one
    a, b, c = token_codes(["nn.Tanh()", "nn.Tanh()", "nn.GELU()"])
    assert np.allclose(a, b) and not np.allclose(a, c) and np.isclose(np.linalg.norm(a), 1.0)


def test_ranks_held_out_code_edits_by_what_the_code_says(embedder):
    cells = list(itertools.product(["0.1", "0.01", "0.001"], ACTIVATIONS, EPOCHS, [False, True]))
    random.Random(0).shuffle(cells)
    train, test = _examples(cells[:64]), _examples(cells[64:])
    wm = CodeOutcomeModel(TASKS, embedder, seed=0)
    wm.fit(train)
    mean, var = wm.predict([e.task_text for e in test], [e.solution_text for e in test])
    assert mean.shape == var.shape == (len(test),) and bool((var > 0).all())
    rng = random.Random(1)
    groups = [rng.sample(range(len(test)), 4) for _ in range(60)]
    stats = within_group_stats([([float(mean[i]) for i in g], [test[i].reward for i in g]) for g in groups])
    assert stats["within_spearman"] > 0.8, stats
    # a dropped optimiser step is predicted to fail, whatever else the edit does
    dropped = [float(m) for m, e in zip(mean, test, strict=True) if e.reward == -1.0]
    kept = [float(m) for m, e in zip(mean, test, strict=True) if e.reward != -1.0]
    assert max(dropped) < min(kept)


def test_variance_grows_off_the_executed_edits(embedder):
    cells = list(itertools.product(["0.1", "0.01"], ACTIVATIONS, EPOCHS, [False, True]))
    wm = CodeOutcomeModel(TASKS, embedder, seed=0)
    ex = _examples(cells)
    wm.fit(ex[::2])
    wm.calibrate_variance(ex[1::2])
    near = [_text("0.001", "GELU", 10, False), _text("0.001", "Tanh", 3, True)]
    far = [
        "LR = 0.1\n-    X = load('train')\n+    X = pandas.read_csv('https://example.com/data.csv').sample(frac=0.1)\n",
        "LR = 0.1\n+    torch.backends.cudnn.benchmark = True; model = torch.compile(model, mode='max-autotune')\n",
    ]
    _, var = wm.predict([TASK] * 4, near + far)
    assert float(var[2:].min()) > float(var[:2].max()), var
    d = wm.distance([TASK] * 4, near + far)
    assert float(d[2:].min()) > float(d[:2].max())


def test_knob_edits_are_the_surrogates_and_state_round_trips(embedder):
    rng = random.Random(0)
    knob = [OutcomeExample("toy", TASK, f"LR = {v}\n", r + rng.gauss(0, 0.01), "ok", "random")
            for v, r in [("0.1", 0.0), ("0.01", 0.5), ("0.001", 0.2)] for _ in range(4)]  # fmt: skip
    code = _examples(itertools.product(["0.1"], ACTIVATIONS, EPOCHS, [False]))
    wm = CodeOutcomeModel(TASKS, embedder, seed=3)
    wm.fit(knob + code)
    ref = KnobSurrogateOutcomeModel(TASKS, seed=3)
    ref.fit(knob)
    texts = ["LR = 0.1\n", "LR = 0.01\n", "LR = 0.001\n"]
    m, v = wm.predict([TASK] * 3, texts)
    rm, rv = ref.predict([TASK] * 3, texts)
    assert torch.equal(m, rm) and torch.equal(v, rv)
    assert len(wm.examples) == len(code)  # the code head holds the code edits only
    again = CodeOutcomeModel(TASKS, embedder, seed=3)
    again.load_state_dict_full(wm.state_dict_full())
    probe = [_text("0.01", "GELU", 3, False), *texts]
    assert all(
        torch.equal(a, b)
        for a, b in zip(wm.predict([TASK] * 4, probe), again.predict([TASK] * 4, probe), strict=True)
    )


def test_plugs_into_the_research_domain(tmp_path, embedder):
    from wmrl.domain import RolloutBatch
    from wmrl_research.code_edits import sample_code_edit
    from wmrl_research.domain import EditRollout, ResearchWorldModel, task_text
    from wmrl_research.edits import apply_edits
    from wmrl_research.tasks import FAILURE_SCORE, get_task
    from wmrl_research.wm_kinds import surrogate_tasks
    from world_models.outcome import ExecutionLog

    task = get_task("iris_cls")
    rng = random.Random(0)
    sources = [apply_edits(task.baseline_source, sample_code_edit(task.baseline_source, rng), "free").source
               for _ in range(12)]  # fmt: skip
    payload = [EditRollout(task.id, "", s) for s in sources] + [EditRollout(task.id, "bad", None, "no match")]
    n = len(payload)
    batch = RolloutBatch(torch.zeros(n, 3).long(), torch.zeros(n, 3), torch.zeros(n, 3),
                         torch.zeros(n, dtype=torch.long), [task], payload)  # fmt: skip
    model = CodeOutcomeModel(surrogate_tasks([task]), embedder, seed=0)
    wm = ResearchWorldModel(model, {task.id: task}, ExecutionLog(tmp_path / "log.jsonl"), update_steps=1)
    rewards = torch.tensor([float(i % 3) / 2 for i in range(n)])
    out = wm.update(batch, torch.arange(n - 1), rewards[: n - 1])
    assert out["update_examples"] == n - 1 and len(model.examples) == n - 1
    pred = wm.predict(batch)
    assert pred.mean[-1].item() == FAILURE_SCORE  # the rejected edit: the failure score, exactly
    assert len(set(pred.mean[:-1].tolist())) > 1  # the applied ones: read, not a constant
    assert all(e.task_text == task_text(task) for e in model.examples)
