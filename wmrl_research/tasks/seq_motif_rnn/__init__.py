"""Generated token sequences: does the ordered motif 3, 7 occur (adjacent)? A small RNN task."""

import numpy as np

from wmrl_research.tasks import Splits, TaskSpec, generator_rng
from wmrl_research.tasks._common import random_split


def _has_motif(seq: np.ndarray) -> bool:
    return bool(np.any((seq[:-1] == 3) & (seq[1:] == 7)))


def build_data() -> Splits:
    rng = generator_rng(9)
    n, length = 2400, 24
    X = rng.integers(0, 10, (n, length))
    for i in range(n):  # remove accidental motifs, then plant one in half the sequences (sometimes 7, 3)
        while _has_motif(X[i]):
            j = np.flatnonzero((X[i, :-1] == 3) & (X[i, 1:] == 7))[0]
            X[i, j + 1] = rng.integers(0, 7)
        if i % 2 == 0:
            j = rng.integers(0, length - 1)
            X[i, j : j + 2] = (3, 7)
        elif i % 4 == 1:
            j = rng.integers(0, length - 1)
            X[i, j : j + 2] = (7, 3)
            if _has_motif(X[i]):
                X[i, j] = 0
    y = np.array([_has_motif(s) for s in X], dtype=np.int64)
    return random_split(X.astype(np.int64), y, seed=9)


TORCH_COMMON_SPACE = {
    "EPOCHS": [1, 2, 4, 8, 12],
    "BATCH_SIZE": [16, 32, 64, 128],
    "LR": [0.0003, 0.001, 0.003, 0.01, 0.03, 0.1],
    "OPTIMIZER": ["sgd", "adam"],
    "WEIGHT_DECAY": [0.0, 0.0001, 0.001],
}

SPEC = TaskSpec(
    description="""
Decide whether a sequence of 24 tokens (ids 0-9) contains the token 3 immediately followed by 7.
Half of the sequences do; a quarter contain the reversed pair 7, 3, which does not count, so token
counts alone cannot solve it. A small recurrent network trained for a fixed number of epochs.
X: [n, 24] int token ids; y: 0 or 1. Metric: test accuracy (higher is better).
""",
    kind="sequence-classification-rnn",
    metric="accuracy",
    build_data=build_data,
    knob_space={
        "CELL": ["rnn", "gru", "lstm"],
        "EMBED": [4, 8, 16],
        "HIDDEN": [8, 16, 32, 64],
        "POOL": ["last", "max"],
        **TORCH_COMMON_SPACE,
    },
    reference_knobs={"CELL": "gru", "HIDDEN": 32, "POOL": "max", "EPOCHS": 4, "LR": 0.01},
    data_version=2,  # generated from a seed drawn with the split secret (issue 52)
    baseline_score=0.54375,
    reference_score=1.0,
)
