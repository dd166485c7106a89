"""Yearly sunspot numbers 1700-2008 (statsmodels' sunspots set; held out)."""

from wmrl_research.tasks import Splits, TaskSpec
from wmrl_research.tasks._common import forecast_windows


def build_data() -> Splits:
    import statsmodels.api as sm

    s = sm.datasets.sunspots.load_pandas().data["SUNACTIVITY"]
    return forecast_windows(s.to_numpy(), context=40, horizon=4, test_windows=3)


SPEC = TaskSpec(
    description="""
Forecast the next 4 yearly sunspot numbers (an irregular cycle of about 11 years) from the
previous 40 years. X: [n, 40] float; y: [n, 4] float. Windows are split by time: train, then
validation, then 3 test windows that do not overlap (the last ends with the series). Metric: test
MAE over all 4 steps (lower is better).
""",
    kind="ts-forecasting",
    metric="mae",
    build_data=build_data,
    knob_space={
        "METHOD": ["naive", "seasonal_naive", "drift", "ridge"],
        "SEASON": [5, 10, 11, 12],
        "N_LAGS": [2, 4, 11, 20, 40],
        "ALPHA": [0.1, 1.0, 10.0, 100.0, 1000.0],
        "RELATIVE": [False, True],
    },
    reference_knobs={"METHOD": "ridge", "N_LAGS": 20, "ALPHA": 100.0},
    data_version=2,  # 2: non-overlapping test windows (before: stride 1, targets visible in later rows)
    baseline_score=43.50833333333333,
    reference_score=15.43573675626872,
    split="heldout",
)
