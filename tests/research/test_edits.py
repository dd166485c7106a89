import random

import pytest
from research_fixtures import END, SOURCE, START, FakeTask

from wmrl_research.edits import (
    Edit,
    EditError,
    apply_edits,
    knob_edit,
    knobs_block,
    parse_edits,
    parse_knobs,
    sample_knob_edit,
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
