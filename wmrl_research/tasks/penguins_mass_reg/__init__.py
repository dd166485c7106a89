"""Penguin body mass from species, island, sex and bill/flipper measurements (held out)."""

import numpy as np

from wmrl_research.tasks import Splits, TaskSpec
from wmrl_research.tasks._common import random_split


def build_data() -> Splits:
    import palmerpenguins

    df = palmerpenguins.load_penguins().dropna(subset=["body_mass_g"])
    X = np.column_stack(
        [
            df[["bill_length_mm", "bill_depth_mm", "flipper_length_mm"]].to_numpy(np.float64),
            (df["species"] == "Chinstrap").to_numpy(np.float64),
            (df["species"] == "Gentoo").to_numpy(np.float64),
            (df["island"] == "Biscoe").to_numpy(np.float64),
            (df["island"] == "Dream").to_numpy(np.float64),
            np.where(df["sex"].isna(), np.nan, (df["sex"] == "male").to_numpy(np.float64)),
        ]
    )
    y = df["body_mass_g"].to_numpy(np.float64)
    return random_split(X, y, seed=5, stratify=False)


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
Predict a penguin's body mass in grams from bill length, bill depth, flipper length, species
indicators (Chinstrap, Gentoo), island indicators (Biscoe, Dream) and sex (NaN where unknown).
X: [n, 8] float with missing values; y: float (about 2700-6300). Metric: test RMSE (lower is better).
""",
    kind="tabular-regression",
    metric="rmse",
    build_data=build_data,
    knob_space=REG_SPACE,
    reference_knobs={"MODEL": "ridge", "SCALE": True},
    baseline_score=359.26152115097176,
    reference_score=301.0235305742299,
    split="heldout",
)
