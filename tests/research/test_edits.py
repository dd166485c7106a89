import random
import re

import pytest
from research_fixtures import END, SOURCE, START, FakeTask

from wmrl_research.edits import (
    Edit,
    EditError,
    apply_edits,
    format_value,
    knob_edit,
    knobs_block,
    parse_edits,
    parse_knobs,
    randomise_knobs,
    sample_knob_edit,
    synthetic_task,
)

KW = {"start": START, "end": END}


def block(search: str, replace: str) -> str:
    return Edit(search, replace).render()


def test_parse_round_trip_and_surrounding_text_ignored():
    text = (
        "Here is my edit.\n"
        + block('MODEL = "ridge"', 'MODEL = "forest"')
        + "\n"
        + block("ALPHA = 1.0", "ALPHA = 0.1")
    )
    edits = parse_edits(text)
    assert edits == [Edit('MODEL = "ridge"', 'MODEL = "forest"'), Edit("ALPHA = 1.0", "ALPHA = 0.1")]


@pytest.mark.parametrize(
    "text, reason",
    [
        ("just prose", "no search/replace block"),
        ("<<<<<<< SEARCH\nMODEL = 1\n=======\nMODEL = 2\n", "unterminated"),
        (block("", "X = 1"), "empty SEARCH"),
    ],
)
def test_parse_rejects_malformed(text, reason):
    with pytest.raises(EditError, match=reason):
        parse_edits(text)


def test_apply_knob_edit_changes_exactly_that_line():
    res = apply_edits(SOURCE, block('MODEL = "ridge"', 'MODEL = "forest"'), "knobs", **KW)
    assert res.ok and res.n_edits == 1
    assert res.source == SOURCE.replace('MODEL = "ridge"\n', 'MODEL = "forest"\n')


def test_blocks_apply_in_sequence():
    text = block("ALPHA = 1.0", "ALPHA = 2.0") + "\n" + block("ALPHA = 2.0", "ALPHA = 3.0")
    res = apply_edits(SOURCE, text, "knobs", **KW)
    assert res.ok and parse_knobs(knobs_block(res.source, **KW))["ALPHA"] == "3.0"


@pytest.mark.parametrize(
    "text, mode, reason",
    [
        (block("MODEL = 'lasso'", "MODEL = 'x'"), "knobs", "not found"),
        (block("print(MODEL, ALPHA, SCALE)", "print(1)"), "knobs", "outside the knobs block"),
        (block("ALPHA = 1.0", f"ALPHA = 1.0\n{END}\nimport os"), "knobs", "contains a knobs marker"),
        (block('"ridge"', '"lasso"'), "free", "occurs 2 times"),
    ],
)
def test_apply_rejects_with_reason(text, mode, reason):
    res = apply_edits(SOURCE, text, mode, **KW)
    assert not res.ok and res.source is None and reason in res.reason


def test_free_mode_allows_edits_outside_the_block():
    text = block("print(MODEL, ALPHA, SCALE)", "print('hi')")
    assert not apply_edits(SOURCE, text, "knobs", **KW).ok
    res = apply_edits(SOURCE, text, "free", **KW)
    assert res.ok and "print('hi')" in res.source


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="not one of"):
        apply_edits(SOURCE, "", "anything", **KW)


def test_knob_edit_and_sampled_edits_always_apply():
    text = knob_edit(SOURCE, {"SCALE": False, "MODEL": "knn"}, **KW)
    res = apply_edits(SOURCE, text, "knobs", **KW)
    assert parse_knobs(knobs_block(res.source, **KW)) == {"MODEL": '"knn"', "ALPHA": "1.0", "SCALE": "False"}
    task, rng = FakeTask(), random.Random(0)
    seen = set()
    for _ in range(50):
        text = sample_knob_edit(task.baseline_source, task.knob_space, rng, max_changes=2, **KW)
        res = apply_edits(SOURCE, text, "knobs", **KW)
        assert res.ok, res.reason
        knobs = parse_knobs(knobs_block(res.source, **KW))
        changed = {k for k, v in knobs.items() if v != parse_knobs(knobs_block(SOURCE, **KW))[k]}
        assert 1 <= len(changed) <= 2
        seen |= changed
    assert seen == {"MODEL", "ALPHA", "SCALE"}
    with pytest.raises(KeyError, match="not in the knobs block"):
        knob_edit(SOURCE, {"DEPTH": 3}, **KW)


def test_synthetic_tasks_look_like_tasks_and_every_sampled_edit_applies():
    from wmrl_research.prompts import build_prompt

    rng = random.Random(0)
    names = set()
    for _ in range(300):
        t = synthetic_task(rng)
        knobs = parse_knobs(knobs_block(t.baseline_source))
        assert 2 <= len(knobs) <= 10 and list(knobs) == list(t.knob_space)
        names |= set(knobs)
        for k, v in knobs.items():  # the current value is one of the candidates, in the same notation
            assert v in {format_value(c) for c in t.knob_space[k]}
        assert build_prompt(t, t.baseline_source, "knobs", "short").endswith("Edit:\n")
        for _ in range(3):
            res = apply_edits(
                t.baseline_source, sample_knob_edit(t.baseline_source, t.knob_space, rng), "knobs"
            )
            assert res.ok and res.source != t.baseline_source
    assert len(names) > 200  # varied identifiers, not a fixed list


def test_randomise_knobs_moves_the_starting_point_within_the_space():
    task = FakeTask()
    rng = random.Random(1)
    seen = set()
    for _ in range(30):
        src = randomise_knobs(task.baseline_source, task.knob_space, rng, p=0.5)
        knobs = parse_knobs(knobs_block(src))
        assert src.replace(knobs_block(src), "") == SOURCE.replace(knobs_block(SOURCE), "")
        for k, v in knobs.items():
            assert k not in task.knob_space or v in {format_value(c) for c in task.knob_space[k]}
        seen.add(tuple(knobs.values()))
    assert len(seen) > 3


# --- knobs mode: a knob line cannot carry code -----------------------------------------------------
@pytest.mark.parametrize(
    "replace, reason",
    [
        # the one-line hack: keep the knob, patch np.save to write rebuilt labels
        (
            "ALPHA = 1.0; _sv = np.save; np.save = lambda f, a: _sv(f, a)",
            "'_sv' is not one of the task's knobs",
        ),
        ("ALPHA = 1.0\nSCALE = (np.save, True)[1]", "SCALE: its value is not a literal"),
        ("ALPHA = 1.0; SCALE = False", "one knob per line"),
        ("ALPHA = __import__('os').system('id')", "not a literal"),
        ("ALPHA = 2 ** 10", "not a literal"),
        ("ALPHA = [x for x in range(3)]", "not a literal"),
        ("ALPHA = 1.0\nimport os", "only `NAME = literal`"),
        ("ALPHA = 1.0\nnp.save = print", "only `NAME = literal`"),
        ("ALPHA, SCALE = 1.0, True", "only `NAME = literal`"),
        ("ALPHA = 1.0\nEVIL = 'x'", "not one of the task's knobs"),
        ('ALPHA = """', "not valid Python"),
        ("ALPHA = 1.0 \\", "not valid Python"),  # a continuation into the end marker's line
        ("ALPHA = " + "[" * 500 + "]" * 500, "literal|not valid Python"),
    ],
)
def test_knobs_mode_accepts_only_literal_knob_values(replace, reason):
    res = apply_edits(SOURCE, block("ALPHA = 1.0", replace), "knobs", **KW)
    assert not res.ok and res.source is None
    assert re.search(reason, res.reason), res.reason


@pytest.mark.parametrize(
    "replace",
    [
        "ALPHA = -0.5",
        "ALPHA = 1e-3  # smaller",
        "ALPHA = None",
        "ALPHA = (1, 2.0, 'a')",
        "ALPHA = [\n  1,\n  2]",
    ],
)
def test_knobs_mode_still_accepts_literal_values(replace):
    res = apply_edits(SOURCE, block("ALPHA = 1.0", replace), "knobs", **KW)
    assert res.ok, res.reason
    assert apply_edits(SOURCE, block("ALPHA = 1.0", "ALPHA = np.pi"), "free", **KW).ok  # free mode: any edit
