"""Friedman #1 regression (scikit-learn's make_friedman1, 40,000 rows, 10 features of which 5 matter):
a multi-layer perceptron trained for several epochs (heavy tier: seconds per execution)."""

import numpy as np

from wmrl_research.tasks import Splits, TaskSpec, generator_seed
from wmrl_research.tasks._common import random_split


def build_data() -> Splits:
    from sklearn.datasets import make_friedman1

    X, y = make_friedman1(n_samples=40000, n_features=10, noise=1.0, random_state=generator_seed(41))
    return random_split(X.astype(np.float64), y.astype(np.float64), seed=41, stratify=False)


SPEC = TaskSpec(
    description="""
Predict y = 10 sin(pi x1 x2) + 20 (x3 - 0.5)^2 + 10 x4 + 5 x5 + noise (sd 1) from 10 uniform
features (x6-x10 are irrelevant), 40,000 rows, with a multi-layer perceptron trained for a fixed
number of epochs. X: [n, 10] float; y: float. Metric: test RMSE (lower is better; the noise alone
gives 1.0).
""",
    kind="tabular-regression",
    metric="rmse",
    build_data=build_data,
    knob_space={
        "HIDDEN": [16, 32, 64, 128],
        "LAYERS": [1, 2, 3],
        "ACTIVATION": ["relu", "tanh", "logistic"],
        "ALPHA": [0.0001, 0.001, 0.01, 0.1],
        "LR": [0.0001, 0.0003, 0.001, 0.003, 0.01],
        "BATCH_SIZE": [64, 128, 256],
        "EPOCHS": [10, 20, 40, 80],
    },
    reference_knobs={"LR": 0.003, "LAYERS": 2},
    data_version=2,  # generated from a seed drawn with the split secret (issue 52)
    baseline_score=1.4339155891747173,
    reference_score=1.0603207056479127,
    tier="heavy",
)
