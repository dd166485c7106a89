"""SFT data of the research pipeline: synthetic tasks and randomised starting points stay valid edits,
and no held-out text reaches the tiny tokenizer or the SFT data."""

import random

from research_fixtures import FakeTask

from wmrl_research.edits import apply_edits, knobs_block, parse_knobs
from wmrl_research.prompts import build_prompt
from wmrl_research.sft import sft_examples


def test_sft_mix_of_tasks_synthetic_and_randomised_edits_all_apply():
    task = FakeTask()
    base_prompt = build_prompt(task, task.baseline_source, "knobs", "short")
    pairs = sft_examples(
        [task], 300, random.Random(0), style="short", synthetic_fraction=0.3, randomise_fraction=0.5
    )
    own = [(p, c) for p, c in pairs if p.startswith(f"Task: {task.id} ")]
    synthetic = [(p, c) for p, c in pairs if not p.startswith(f"Task: {task.id} ")]
    assert 50 < len(synthetic) < 130
    moved = [p for p, _ in own if p != base_prompt]
    assert 0.2 * len(own) < len(moved) < 0.6 * len(own)
    for p, c in own:  # the edit applies to the solution whose knobs the prompt shows
        current = dict(line.split("  #")[0].split(" = ", 1) for line in p.splitlines()[1:-1])
        src = task.baseline_source
        for k, v in current.items():
            src = src.replace(f"{k} = {parse_knobs(knobs_block(task.baseline_source))[k]}", f"{k} = {v}", 1)
        res = apply_edits(src, c, "knobs")
        assert res.ok and res.source != src


def test_pipeline_tokenizer_and_sft_never_read_heldout_text(monkeypatch, tmp_path):
    from wmrl_research import pipeline
    from wmrl_research.tasks import list_tasks

    seen: list[str] = []

    def fake_build_tokenizer(corpus, *args, **kwargs):
        seen.extend(corpus)
        raise RuntimeError("stop")

    monkeypatch.setattr(pipeline, "build_tokenizer", fake_build_tokenizer)
    from wmrl.config import load_config

    cfg = load_config("research-tiny", [f"--domain.cache_dir={tmp_path}", f"--out_dir={tmp_path / 'run'}"])
    train, heldout = pipeline.select_tasks(cfg.domain)
    try:
        pipeline.build_policy(cfg.domain, cfg, train, heldout, tmp_path)
    except RuntimeError:
        pass
    text = "\n".join(seen)
    assert seen and all(t.id in text for t in train)
    for t in list_tasks("heldout"):
        assert t.id not in text
        # no held-out knob line (name and current value) appears unless a train task has it too
        train_text = "\n".join(t2.baseline_source for t2 in train)
        for k, v in parse_knobs(knobs_block(t.baseline_source)).items():
            if f"{k} = {v}" not in train_text:
                assert f"\n{k} = {v}  #" not in text
