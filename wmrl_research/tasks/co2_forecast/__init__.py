"""Monthly Mauna Loa CO2 (statsmodels' co2 set, weekly readings averaged per month)."""

from wmrl_research.tasks import Splits, TaskSpec
from wmrl_research.tasks._common import forecast_windows


def build_data() -> Splits:
    import statsmodels.api as sm

    s = sm.datasets.co2.load_pandas().data["co2"].resample("MS").mean().interpolate()
    return forecast_windows(s.to_numpy(), context=48, horizon=12, test_windows=4)


SPEC = TaskSpec(
    description="""
Forecast the next 12 monthly CO2 concentrations (ppm, Mauna Loa, 1958-2001: a trend plus a yearly
cycle) from the previous 48 months. X: [n, 48] float; y: [n, 12] float. Windows are split by
time: train, then validation, then 4 test windows that do not overlap (the last ends with the
series). Metric: test MAE over all 12 steps (lower is better).
""",
    kind="ts-forecasting",
    metric="mae",
    build_data=build_data,
    knob_space={
        "METHOD": ["naive", "seasonal_naive", "drift", "ridge"],
        "SEASON": [4, 6, 12, 24],
        "N_LAGS": [3, 6, 12, 24, 48],
        "ALPHA": [0.01, 0.1, 1.0, 10.0, 100.0],
        "RELATIVE": [False, True],
    },
    reference_knobs={"METHOD": "ridge", "N_LAGS": 24, "RELATIVE": True},
    data_version=2,  # 2: non-overlapping test windows (before: stride 1, targets visible in later rows)
    baseline_score=2.0626041666666595,
    reference_score=0.36029617037374945,
)
