"""A large generated 4-class tabular problem (scikit-learn's make_classification, 16,000 rows):
gradient-boosted trees bagged over cross-validation folds (heavy tier: seconds per execution)."""

import numpy as np

from wmrl_research.tasks import Splits, TaskSpec, generator_seed
from wmrl_research.tasks._common import random_split


def build_data() -> Splits:
    from sklearn.datasets import make_classification

    X, y = make_classification(
        n_samples=16000,
        n_features=40,
        n_informative=14,
        n_redundant=6,
        n_classes=4,
        n_clusters_per_class=3,
        class_sep=0.9,
        flip_y=0.02,
        random_state=generator_seed(31),
    )
    return random_split(X.astype(np.float64), y.astype(np.int64), seed=31)


SPEC = TaskSpec(
    description="""
Classify 16,000 generated rows (40 numeric features, 14 informative, 6 redundant linear mixtures of
them, the rest noise; 4 classes, each a mixture of 3 clusters; 2% of labels flipped) with histogram
gradient-boosted trees, one model per cross-validation fold, their probabilities averaged.
X: [n, 40] float; y: class 0-3. Metric: test accuracy (higher is better).
""",
    kind="tabular-classification",
    metric="accuracy",
    build_data=build_data,
    knob_space={
        "LEARNING_RATE": [0.01, 0.03, 0.1, 0.3],
        "MAX_ITER": [25, 50, 100, 200],
        "MAX_LEAF_NODES": [7, 15, 31, 63],
        "MIN_SAMPLES_LEAF": [5, 20, 80],
        "L2": [0.0, 0.1, 1.0, 10.0],
        "MAX_FEATURES": [0.3, 0.6, 1.0],
        "FOLDS": [1, 3, 5],
    },
    reference_knobs={"LEARNING_RATE": 0.1, "MAX_LEAF_NODES": 31},
    data_version=2,  # generated from a seed drawn with the split secret (issue 52)
    baseline_score=0.655625,
    reference_score=0.7803125,
    tier="heavy",
)
