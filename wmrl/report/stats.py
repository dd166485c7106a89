"""The statistics of a comparison report: mean and standard error over seeds, paired differences,
their one-sided lower bounds and the non-inferiority verdict (docs/design.md section 7)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import mean, stdev


def mean_se(values: Sequence[float | None]) -> dict | None:
    """``{"mean", "se", "n"}`` over the present values (se: sample std / sqrt(n), None for n < 2)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    se = stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else None
    return {"mean": float(mean(vals)), "se": se, "n": len(vals)}


def paired(a: dict[int, float | None], b: dict[int, float | None]) -> dict | None:
    """Mean +- s.e. of ``a[seed] - b[seed]`` over the seeds where both are present."""
    return mean_se([x - y for s, x in a.items() if x is not None and (y := b.get(s)) is not None])


# ---- the evidence standard -----------------------------------------------------------------------

CONFIDENCE = 0.95  # one-sided
VERDICTS = ("superior", "non-inferior", "not shown")
MULTIPLICITY = (
    "each verdict is one comparison at 95%, with no correction for the other comparisons beside it: "
    "exploratory, unless a confirmatory family declared before the grid ran confirms it after Holm's "
    "correction (`wmrl family`, docs/compare.md)"
)


def lower_bound_t(diffs: list[float], confidence: float = CONFIDENCE) -> float | None:
    """One-sided lower confidence bound of the mean of paired differences ``d`` (``[n]``):

        LB = mean(d) − t_{confidence, n−1} · sd(d) / √n

    from scipy's one-sample t test (``alternative="greater"``). The mean itself when every
    difference is equal (no spread); None for ``n < 2``."""
    import numpy as np
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    if d.size < 2:
        return None
    if np.ptp(d) == 0:
        return float(d[0])
    return float(stats.ttest_1samp(d, 0.0, alternative="greater").confidence_interval(confidence).low)


def lower_bound_bootstrap(diffs: list[float], confidence: float = CONFIDENCE) -> float | None:
    """One-sided BCa bootstrap lower bound of the mean of ``d`` (scipy.stats.bootstrap, 9,999
    resamples, a fixed generator so a report is reproducible). Few seeds make it narrower than the
    t bound (it ignores the t tail); None for ``n < 3`` or no spread."""
    import numpy as np
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    if d.size < 3 or np.ptp(d) == 0:
        return None
    res = stats.bootstrap(
        (d,), np.mean, confidence_level=confidence, alternative="greater", method="BCa",
        n_resamples=9999, rng=np.random.default_rng(0),
    )  # fmt: skip
    low = float(res.confidence_interval.low)
    return low if math.isfinite(low) else None


def verdict(lower_bound: float | None, margin: float | None) -> str | None:
    """``superior`` (LB > 0), ``non-inferior`` (−margin < LB <= 0) or ``not shown`` (LB <= −margin)
    for the lower bound of a method minus ``anchors_only``; None without a bound or a margin."""
    if lower_bound is None or margin is None:
        return None
    return VERDICTS[0] if lower_bound > 0 else VERDICTS[1] if lower_bound > -margin else VERDICTS[2]


def paired_evidence(a: dict[int, float | None], b: dict[int, float | None], seeds: list[int]) -> dict | None:
    """``a[s] − b[s]`` over those of ``seeds`` where both are present: the seeds, mean, s.e., n,
    the one-sided 95% lower bounds (t and BCa bootstrap) and the seeds where ``a`` is ahead."""
    pairs = [(s, x - y) for s in seeds if (x := a.get(s)) is not None and (y := b.get(s)) is not None]
    if not pairs:
        return None
    d = [x for _, x in pairs]
    return (mean_se(d) or {}) | {
        "seeds": [s for s, _ in pairs],
        "lb_t": lower_bound_t(d),
        "lb_bootstrap": lower_bound_bootstrap(d),
        "wins": int(sum(x > 0 for x in d)),
    }


def clears(controls: list[dict | None]) -> bool | None:
    """Whether a method clears its controls: False where a control was not run on its seeds or a
    lower bound of the method minus a control is <= 0, None where a bound is undetermined (n < 2)
    and none failed, True where every bound is > 0; None without controls."""
    if not controls:
        return None
    if any(c is None or (c["lb_t"] is not None and c["lb_t"] <= 0) for c in controls):
        return False
    return None if any(c is not None and c["lb_t"] is None for c in controls) else True
