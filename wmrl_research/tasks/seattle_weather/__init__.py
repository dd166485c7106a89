"""Daily Seattle weather type from precipitation, temperatures, wind and season (vega_datasets)."""

import numpy as np

from wmrl_research.tasks import Splits, TaskSpec
from wmrl_research.tasks._common import random_split

WEATHER = ["drizzle", "fog", "rain", "snow", "sun"]


def build_data() -> Splits:
    from vega_datasets import local_data

    df = local_data.seattle_weather()
    doy = df["date"].dt.dayofyear.to_numpy(np.float64)
    X = np.column_stack(
        [
            df[["precipitation", "temp_max", "temp_min", "wind"]].to_numpy(np.float64),
            np.sin(2 * np.pi * doy / 365.25),
            np.cos(2 * np.pi * doy / 365.25),
            df["date"].dt.year.to_numpy(np.float64),
        ]
    )
    y = df["weather"].map(WEATHER.index).to_numpy(np.int64)
    return random_split(X, y, seed=2)


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
Classify each day's Seattle weather (drizzle, fog, rain, snow, sun; imbalanced: drizzle, fog and
snow are rare) from precipitation, max/min temperature, wind, the season (sin/cos of the day of
year) and the year. X: [n, 7] float; y: class 0-4. Metric: test macro-F1 (higher is better).
""",
    kind="tabular-classification",
    metric="macro_f1",
    build_data=build_data,
    knob_space=TAB_CLS_SPACE,
    reference_knobs={"MODEL": "hgb", "CLASS_WEIGHT": "balanced", "N_ESTIMATORS": 100},
    baseline_score=0.2586388422936703,
    reference_score=0.6507723338734727,
)
