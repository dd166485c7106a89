"""Iris species from four flower measurements (scikit-learn's bundled iris set)."""

import numpy as np

from wmrl_research.tasks import Splits, TaskSpec
from wmrl_research.tasks._common import random_split


def build_data() -> Splits:
    from sklearn.datasets import load_iris  # import heavy libraries inside the builder

    X, y = load_iris(return_X_y=True)
    return random_split(X.astype(np.float64), y.astype(np.int64), seed=12)


SPEC = TaskSpec(
    description="""
Classify iris flowers into 3 species from sepal and petal length and width (cm).
X: [n, 4] float; y: class 0-2. Metric: test accuracy (higher is better).
""",
    kind="tabular-classification",
    metric="accuracy",  # a name in wmrl_research.tasks.metrics.METRICS, or Metric(name, direction, fn)
    build_data=build_data,
    knob_space={"C": [0.001, 0.01, 0.1, 1.0, 10.0], "MAX_ITER": [20, 100, 500]},
    reference_knobs={"C": 1.0},  # the reference solution = the baseline with these knob values
    baseline_score=0.7666666666666667,  # measured with `python -m wmrl_research.tasks measure`
    reference_score=0.9333333333333333,
    split="train",  # or "heldout"
)
