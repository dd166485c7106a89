"""Wine cultivars from 13 chemical measurements (scikit-learn's bundled wine set)."""

import numpy as np

from wmrl_research.tasks import Splits, TaskSpec
from wmrl_research.tasks._common import random_split


def build_data() -> Splits:
    from sklearn.datasets import load_wine

    X, y = load_wine(return_X_y=True)
    return random_split(X.astype(np.float64), y.astype(np.int64), seed=0)


TAB_CLS_SPACE = {
    "MODEL": ["logreg", "knn", "forest", "hgb"],
    "SCALE": [False, True],
    "C": [0.001, 0.01, 0.1, 1.0, 10.0],
    "MAX_ITER": [20, 100, 500],
    "N_NEIGHBORS": [1, 5, 15, 50],
    "N_ESTIMATORS": [10, 50, 100, 200],
    "MAX_DEPTH": [2, 3, 6, None],
    "LEARNING_RATE": [0.03, 0.1, 0.3],
    "CLASS_WEIGHT": [None, "balanced"],
}

SPEC = TaskSpec(
    description="""
Classify wines into 3 cultivars from 13 chemical measurements (178 samples, features on very
different scales). X: [n, 13] float; y: class 0-2. Metric: test accuracy (higher is better).
""",
    kind="tabular-classification",
    metric="accuracy",
    build_data=build_data,
    knob_space=TAB_CLS_SPACE,
    reference_knobs={"SCALE": True, "C": 1.0},
    baseline_score=0.7142857142857143,
    reference_score=1.0,
)
