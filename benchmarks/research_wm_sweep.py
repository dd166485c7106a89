"""A sweep of single tabular regressors on the knob features of the random-edit log (exploratory).

The same folds as ``benchmarks/research_wm.py`` (5, grouped by edit), one model per task and fold,
within-group Spearman and top-1 on random groups of 4 held-out edits. It needs the cached log that
``research_wm.py`` builds (96 per task, seed 0). What chose the knob surrogate's default estimator.

    uv run python benchmarks/research_wm_sweep.py [VARIANT ...]
"""

import random
import statistics
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from research_wm import _folds, _groups
from sklearn.ensemble import ExtraTreesRegressor as E
from sklearn.ensemble import GradientBoostingRegressor as G
from sklearn.ensemble import HistGradientBoostingRegressor as H
from sklearn.ensemble import RandomForestRegressor as R

from wmrl_research.config import ResearchConfig
from wmrl_research.diagnose import within_group_stats
from wmrl_research.execution_logs import random_log_path
from wmrl_research.pipeline import select_tasks
from wmrl_research.tasks import list_tasks
from wmrl_research.wm_kinds import surrogate_tasks
from world_models.knob_surrogate import KnobSpace
from world_models.outcome import ExecutionLog

_cfg = ResearchConfig(log_random_per_task=96, cache_dir="runs/cache/research")
ex = ExecutionLog(random_log_path(_cfg, select_tasks(_cfg)[0])).load()
spaces = {k: KnobSpace(*v) for k, v in surrogate_tasks(list_tasks()).items()}
X = [spaces[e.task_text].features(e.solution_text) for e in ex]
y = np.array([e.reward for e in ex])
folds = _folds(ex, 5, 0)


def onehot(task, x):
    sp = spaces[task]
    cols = []
    for j, n in enumerate(sp.names):
        k = len(sp.index[n])
        idx = x[:, 3 * j]
        cols.append(np.stack([(idx == i).astype(float) for i in range(k)], 1))
    return np.concatenate([np.nan_to_num(x, nan=-1)] + cols, 1)


variants = {
    "hgb_cur": lambda: H(
        max_iter=150,
        learning_rate=0.1,
        max_leaf_nodes=8,
        min_samples_leaf=3,
        l2_regularization=0.1,
        early_stopping=False,
    ),
    "hgb_small": lambda: H(
        max_iter=300,
        learning_rate=0.05,
        max_leaf_nodes=6,
        min_samples_leaf=2,
        l2_regularization=0.0,
        early_stopping=False,
    ),
    "gbr": lambda: G(
        n_estimators=200, max_depth=3, learning_rate=0.05, subsample=0.8, min_samples_leaf=2, random_state=0
    ),
    "et": lambda: E(200, min_samples_leaf=1, max_features=0.7, random_state=0),
    "et_mf1": lambda: E(200, min_samples_leaf=1, max_features=1.0, random_state=0),
    "et_mf5": lambda: E(200, min_samples_leaf=1, max_features=0.5, random_state=0),
    "et_msl2": lambda: E(200, min_samples_leaf=2, max_features=0.7, random_state=0),
    "et_oh": lambda: E(200, min_samples_leaf=1, max_features=0.7, random_state=0),
    "et_oh_mf1": lambda: E(200, min_samples_leaf=1, max_features=1.0, random_state=0),
    "et_oh_400": lambda: E(400, min_samples_leaf=1, max_features=1.0, random_state=0),
    "et_oh_boot": lambda: E(200, min_samples_leaf=1, max_features=1.0, bootstrap=True, random_state=0),
    "rf": lambda: R(200, min_samples_leaf=1, max_features=0.7, random_state=0),
}
which = sys.argv[1:] or list(variants)
for name in which:
    t0 = time.time()
    sp = []
    tp = []
    for f in range(5):
        test = folds[f]
        train = [i for g in range(5) if g != f for i in folds[g]]
        pred = np.zeros(len(ex))
        for task in spaces:
            tr = [i for i in train if ex[i].task_text == task]
            te = [i for i in test if ex[i].task_text == task]
            if not tr:
                continue
            xtr = np.stack([X[i] for i in tr])
            xte = np.stack([X[i] for i in te])
            keep = ~np.all(np.isnan(xtr), 0)
            xtr, xte = xtr[:, keep], xte[:, keep]
            if name.startswith("et_oh"):
                xtr = onehot(task, np.stack([X[i] for i in tr]))
                xte = onehot(task, np.stack([X[i] for i in te]))
            elif name.startswith(("et", "rf", "gbr")):
                xtr = np.nan_to_num(xtr, nan=-1)
                xte = np.nan_to_num(xte, nan=-1)
            with threadpool_limits(1):
                m = variants[name]().fit(xtr, y[tr])
                pred[te] = m.predict(xte)
        groups = _groups(ex, test, 25, 4, random.Random(f))
        w = within_group_stats([([pred[i] for i in g], [y[i] for i in g]) for g in groups])
        sp.append(w["within_spearman"])
        tp.append(w["top1"])
    print(
        name,
        round(statistics.mean(sp), 3),
        round(statistics.mean(tp), 3),
        f"{time.time() - t0:.0f}s",
        flush=True,
    )
