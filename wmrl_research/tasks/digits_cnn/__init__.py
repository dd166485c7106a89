"""8x8 handwritten digits (scikit-learn's digits set) with a small torch CNN."""

import numpy as np

from wmrl_research.tasks import Splits, TaskSpec
from wmrl_research.tasks._common import random_split


def build_data() -> Splits:
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return random_split(X.astype(np.float32), y.astype(np.int64), seed=7)


TORCH_COMMON_SPACE = {
    "EPOCHS": [1, 2, 4, 8, 12],
    "BATCH_SIZE": [16, 32, 64, 128],
    "LR": [0.0003, 0.001, 0.003, 0.01, 0.03, 0.1],
    "OPTIMIZER": ["sgd", "adam"],
    "WEIGHT_DECAY": [0.0, 0.0001, 0.001],
}

SPEC = TaskSpec(
    description="""
Classify 8x8 grey-scale images of handwritten digits (0-9, pixel values 0-16) with a small
convolutional network trained for a fixed number of epochs. X: [n, 64] float (row-major 8x8
images); y: class 0-9. Metric: test accuracy (higher is better).
""",
    kind="image-classification-cnn",
    metric="accuracy",
    build_data=build_data,
    knob_space={
        "CHANNELS": [4, 8, 16, 32],
        "DEPTH": [1, 2, 3],
        "DROPOUT": [0.0, 0.1, 0.3],
        **TORCH_COMMON_SPACE,
    },
    reference_knobs={"CHANNELS": 16, "EPOCHS": 8, "BATCH_SIZE": 32, "LR": 0.003, "OPTIMIZER": "adam"},
    baseline_score=0.15555555555555556,
    reference_score=0.9472222222222222,
)
