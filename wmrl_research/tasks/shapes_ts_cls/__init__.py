"""Generated waveforms (sine, square, sawtooth, triangle) with random phase, frequency, scale, noise."""

import numpy as np

from wmrl_research.tasks import Splits, TaskSpec, generator_rng
from wmrl_research.tasks._common import random_split


def build_data() -> Splits:
    from scipy import signal

    rng = generator_rng(6)
    n, length = 1200, 64
    t = np.linspace(0, 1, length, endpoint=False)
    y = rng.integers(0, 4, n)
    freq = rng.uniform(2, 5, n)[:, None]
    phase = rng.uniform(0, 2 * np.pi, n)[:, None]
    arg = 2 * np.pi * freq * t[None, :] + phase
    waves = [np.sin(arg), signal.square(arg), signal.sawtooth(arg), signal.sawtooth(arg, 0.5)]
    X = np.choose(y[:, None], waves)
    X = X * rng.uniform(0.5, 3, (n, 1)) + rng.normal(0, 1, (n, 1)) + rng.normal(0, 0.4, (n, length))
    return random_split(X.astype(np.float64), y.astype(np.int64), seed=6)


SPEC = TaskSpec(
    description="""
Classify noisy waveforms of 64 samples into 4 shapes (sine, square, sawtooth, triangle). Each
series has a random frequency (2-5 cycles), phase, amplitude and offset, plus white noise, so raw
sample positions carry little signal. X: [n, 64] float; y: class 0-3. Metric: test accuracy
(higher is better).
""",
    kind="ts-classification",
    metric="accuracy",
    build_data=build_data,
    knob_space={
        "FEATURES": ["raw", "fft", "stats"],
        "NORMALISE": [False, True],
        "N_FREQS": [4, 8, 16, 33],
        "MODEL": ["logreg", "knn", "forest", "hgb"],
        "C": [0.01, 0.1, 1.0, 10.0],
        "N_NEIGHBORS": [1, 5, 15],
        "N_ESTIMATORS": [20, 50, 100],
    },
    reference_knobs={
        "FEATURES": "fft",
        "NORMALISE": True,
        "N_FREQS": 33,
        "MODEL": "forest",
        "N_ESTIMATORS": 100,
    },
    data_version=2,  # generated from a seed drawn with the split secret (issue 52)
    baseline_score=0.26778242677824265,
    reference_score=0.6569037656903766,
)
