"""Disease progression one year after baseline from 10 clinical variables (scikit-learn's diabetes)."""

import numpy as np

from wmrl_research.tasks import Splits, TaskSpec
from wmrl_research.tasks._common import random_split


def build_data() -> Splits:
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    return random_split(X.astype(np.float64), y.astype(np.float64), seed=4, stratify=False)


REG_SPACE = {
    "MODEL": ["ridge", "knn", "forest", "hgb"],
    "ALPHA": [0.01, 0.1, 1.0, 10.0, 100.0],
    "SCALE": [False, True],
    "POLY_DEGREE": [1, 2],
    "LOG_TARGET": [False, True],
    "N_NEIGHBORS": [3, 5, 15, 30],
    "N_ESTIMATORS": [20, 50, 100, 200],
    "MAX_DEPTH": [2, 3, 6, None],
    "LEARNING_RATE": [0.03, 0.1, 0.3],
}

SPEC = TaskSpec(
    description="""
Predict a quantitative measure of diabetes progression one year after baseline from 10 clinical
variables (age, sex, BMI, blood pressure, six serum measurements; already centred and scaled to
small values). 442 patients. X: [n, 10] float; y: float (about 25-346). Metric: test RMSE (lower
is better).
""",
    kind="tabular-regression",
    metric="rmse",
    build_data=build_data,
    knob_space=REG_SPACE,
    reference_knobs={"ALPHA": 0.1},
    baseline_score=74.05463126684842,
    reference_score=58.958903065480996,
)
