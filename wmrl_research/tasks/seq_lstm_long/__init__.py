"""Generated token sequences of length 64: does token 3 occur with token 7 two to five positions
later? A recurrent-network task with a longer-range dependency (heavy tier: seconds per execution)."""

import numpy as np

from wmrl_research.tasks import Splits, TaskSpec, generator_rng
from wmrl_research.tasks._common import random_split

LENGTH, GAPS = 64, (2, 3, 4, 5)


def has_motif(seq: np.ndarray) -> bool:
    """Token 3 at i and token 7 at i + g for a gap g in GAPS."""
    return any(bool(np.any((seq[:-g] == 3) & (seq[g:] == 7))) for g in GAPS)


def build_data() -> Splits:
    rng = generator_rng(51)
    n = 8000
    X = rng.integers(0, 16, (n, LENGTH))
    X[X == 7] = rng.integers(8, 16, int(np.sum(X == 7)))  # 7 appears only where planted
    for i in range(n):
        j = rng.integers(0, LENGTH - 12)
        if i % 2 == 0:  # 3, then 7 within the gaps
            X[i, j], X[i, j + rng.choice(GAPS)] = 3, 7
        elif i % 4 == 1:  # decoy: 3 and 7 too far apart
            X[i, j], X[i, j + rng.integers(6, 12)] = 3, 7
        else:  # decoy: 7 right before 3
            X[i, j], X[i, j + 1] = 7, 3
    y = np.array([has_motif(s) for s in X], dtype=np.int64)
    return random_split(X.astype(np.int64), y, seed=51)


SPEC = TaskSpec(
    description="""
Decide whether a sequence of 64 tokens (ids 0-15) contains token 3 followed by token 7 two to five
positions later. About half of the sequences do; the others hold decoys (7 right before 3, or 3
and 7 further apart), so neither token counts nor adjacent pairs solve it. A recurrent network
(optionally stacked and bidirectional) trained for a fixed number of epochs on 8,000 sequences.
X: [n, 64] int token ids; y: 0 or 1. Metric: test accuracy (higher is better).
""",
    kind="sequence-classification-rnn",
    metric="accuracy",
    build_data=build_data,
    knob_space={
        "CELL": ["rnn", "gru", "lstm"],
        "EMBED": [8, 16, 32],
        "HIDDEN": [16, 32, 64],
        "LAYERS": [1, 2],
        "BIDIRECTIONAL": [False, True],
        "POOL": ["last", "max"],
        "CLIP": [0.5, 1.0, 5.0],
        "EPOCHS": [2, 4, 8],
        "BATCH_SIZE": [32, 64, 128],
        "LR": [0.0003, 0.001, 0.003, 0.01],
        "OPTIMIZER": ["sgd", "adam"],
        "WEIGHT_DECAY": [0.0, 0.0001, 0.001],
    },
    reference_knobs={"CELL": "gru", "POOL": "max", "LR": 0.003},
    data_version=2,  # generated from a seed drawn with the split secret (issue 52)
    baseline_score=0.605,
    reference_score=1.0,
    tier="heavy",
)
