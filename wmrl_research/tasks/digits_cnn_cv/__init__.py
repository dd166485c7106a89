"""8x8 handwritten digits (scikit-learn's digits set): a CNN ensemble over cross-validation folds,
with augmentation and longer training (heavy tier: seconds per execution)."""

import numpy as np

from wmrl_research.tasks import Splits, TaskSpec
from wmrl_research.tasks._common import random_split


def build_data() -> Splits:
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return random_split(X.astype(np.float32), y.astype(np.int64), seed=21)


SPEC = TaskSpec(
    description="""
Classify 8x8 grey-scale images of handwritten digits (0-9, pixel values 0-16) with an ensemble of
convolutional networks, one trained per cross-validation fold (the printed CV accuracy scores each
on its held-out fold), for a fixed number of epochs, optionally with random-shift augmentation.
X: [n, 64] float (row-major 8x8 images); y: class 0-9. Metric: test accuracy (higher is better).
""",
    kind="image-classification-cnn",
    metric="accuracy",
    build_data=build_data,
    knob_space={
        "CHANNELS": [8, 16, 32],
        "DEPTH": [1, 2, 3],
        "DROPOUT": [0.0, 0.1, 0.3],
        "SHIFT": [0, 1],
        "FOLDS": [1, 3, 5],
        "EPOCHS": [5, 10, 20, 40],
        "BATCH_SIZE": [16, 32, 64, 128],
        "LR": [0.0003, 0.001, 0.003, 0.01, 0.03, 0.1],
        "OPTIMIZER": ["sgd", "adam"],
        "WEIGHT_DECAY": [0.0, 0.0001, 0.001],
    },
    reference_knobs={"LR": 0.003, "OPTIMIZER": "adam", "SHIFT": 1},
    baseline_score=0.6527777777777778,
    reference_score=0.9833333333333333,
    tier="heavy",
)
