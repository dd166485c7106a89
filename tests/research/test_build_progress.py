"""The research build's long stages follow ``tracking.progress`` (issue 28, item 9)."""

from wmrl.config import ExecutorConfig
from wmrl.executors import make_executor
from wmrl_research.config import ResearchConfig
from wmrl_research.execution_logs import build_random_log, random_log_path
from wmrl_research.tasks import get_task


def test_the_random_log_stage_shows_progress_only_when_asked(tmp_path, capfd):
    cfg = ResearchConfig(log_random_per_task=2, cache_dir=str(tmp_path), train_tasks=["iris_cls"])
    train = [get_task("iris_cls")]
    ex = make_executor(ExecutorConfig(type="inline"), 1)
    capfd.readouterr()
    build_random_log(cfg, train, ex, random_log_path(cfg, train), progress=True)
    err = capfd.readouterr().err
    assert "[research] random log: executing 2 random knob edits (2 per task) [" in err
    assert "[research] random log: 2 records in " in err
    quiet = ResearchConfig(log_random_per_task=1, cache_dir=str(tmp_path), train_tasks=["iris_cls"])
    build_random_log(quiet, train, ex, random_log_path(quiet, train), progress=False)
    assert "[research]" not in capfd.readouterr().err
