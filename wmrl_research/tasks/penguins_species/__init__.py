"""Penguin species from body measurements, island and sex (palmerpenguins; has missing values)."""

import numpy as np

from wmrl_research.tasks import Splits, TaskSpec
from wmrl_research.tasks._common import random_split

SPECIES = ["Adelie", "Chinstrap", "Gentoo"]


def build_data() -> Splits:
    import palmerpenguins

    df = palmerpenguins.load_penguins()
    y = df["species"].map(SPECIES.index).to_numpy(np.int64)
    X = np.column_stack(
        [
            df[["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]].to_numpy(np.float64),
            (df["island"] == "Biscoe").to_numpy(np.float64),
            (df["island"] == "Dream").to_numpy(np.float64),
            np.where(df["sex"].isna(), np.nan, (df["sex"] == "male").to_numpy(np.float64)),
        ]
    )
    return random_split(X, y, seed=1)


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
Classify penguins into 3 species (Adelie, Chinstrap, Gentoo) from bill length, bill depth,
flipper length, body mass (g), two island indicators and sex (NaN where unknown). X: [n, 7] float
with missing values; y: class 0-2. Metric: test accuracy (higher is better).
""",
    kind="tabular-classification",
    metric="accuracy",
    build_data=build_data,
    knob_space=TAB_CLS_SPACE,
    reference_knobs={"MODEL": "logreg", "SCALE": True, "C": 1.0, "MAX_ITER": 500},
    baseline_score=0.7971014492753623,
    reference_score=1.0,
)
