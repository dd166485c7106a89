"""The method registry (wmrl/methods): one object per method, and every method's maths unchanged."""

import pytest
import torch

from wmrl.config import load_config
from wmrl.trainer import Trainer

FAST = [
    "--executor.type=inline",
    "--tracking.wandb=disabled",
    "--tracking.progress=false",
    "--grpo.optimizer=sgd",
    "--grpo.lr=20",
    "--grpo.tasks_per_step=8",
    "--grpo.steps=6",
    "--seed=3",
    # short warm-ups, so that calibration, the denoiser's w and ppi's λ all act within 6 steps
    "--debias.warmup_pairs=16",
    "--debias.refit_every=8",
    "--denoise.warmup_obs=4",
    "--ppi.warmup_groups=2",
]

# Each method, and each option or control that takes its own branch, as `wmrl run` flags.
CASES: dict[str, list[str]] = {
    "real": ["--method=real"],
    "anchors_only": ["--method=anchors_only"],
    "wm": ["--method=wm"],
    "mix": ["--method=mix"],
    "debias": ["--method=debias"],
    "denoise": ["--method=denoise"],
    "wmrl": ["--method=wmrl"],
    "ppi": ["--method=ppi"],
    "wmrl+sample_weights": ["--method=wmrl", "--denoise.sample_weights=true"],
    "ppi+prior_from_log": ["--method=ppi", "--ppi.prior_from_log=true"],
    "ppi+gradient_moments": ["--method=ppi", "--ppi.moments=gradient", "--ppi.shrink_confidence=null"],
    "ppi+twins": ["--method=ppi", "--domain.type=toy", "--domain.twin_anchors=true"],
    "wmrl_placebo": ["--method=wmrl", "--wm_placebo=true"],
    "ppi_placebo+prior_from_log": ["--method=ppi", "--wm_placebo=true", "--ppi.prior_from_log=true"],
    "ppi_lambda0": ["--method=ppi", "--ppi.lam=0"],
}


def final_digest(out_dir, overrides: list[str]) -> tuple[float, float, float]:
    """A 6-step toy run's final policy parameters ``theta`` ``[K, A]`` as three numbers: their sum
    of squares and their dot products with ``cos(i)`` and ``sin(i)`` (``i`` the flat index)."""
    cfg = load_config(None, [*FAST, f"--out_dir={out_dir}", *overrides])
    domain = cfg.domain.build(cfg)
    Trainer(cfg, domain).train()
    theta = domain.policy.theta.detach().double().flatten()
    i = torch.arange(theta.numel(), dtype=torch.float64)
    return float((theta**2).sum()), float(theta @ i.cos()), float(theta @ i.sin())


# ``final_digest`` of each case, recorded from the code before the method registry existed (commit
# ee520cf); a change to any method's maths moves these by far more than the tolerance, which only
# absorbs last-bit differences between CPUs.
RECORDED: dict[str, tuple[float, float, float]] = {
    "real": (80.05170039537813, 4.077611728942152, -4.171384581305105),
    "anchors_only": (279.84898199213114, 8.5115886955933, -11.819027996522522),
    "wm": (51.25051861344376, 6.618485108347171, -6.552774702914431),
    "mix": (58.22266645880094, 6.394034190517089, -4.794020534265503),
    "debias": (65.91550692955256, 4.091934536394614, 0.9737652230384999),
    "denoise": (72.49911519354382, 7.068562920400501, -7.397056244089274),
    "wmrl": (78.29302005060586, 5.041943911848504, -2.2359508771379013),
    "ppi": (270.1814577895178, 12.23557248788228, -5.223263838565399),
    "wmrl+sample_weights": (95.30081530019189, -1.7521917477586681, 2.709892873699272),
    "ppi+prior_from_log": (234.27478815935515, 8.287271830876115, -7.254663546287377),
    "ppi+gradient_moments": (232.0641002121355, 8.037274012137903, 4.005837394517938),
    "ppi+twins": (280.3526162258231, 12.815815680074994, -14.19507450679452),
    "wmrl_placebo": (62.019261813985445, 5.9051671647981445, -7.327277494055967),
    "ppi_placebo+prior_from_log": (324.532595743979, 12.071572198907893, -17.376984878102164),
    "ppi_lambda0": (323.7600164465331, 11.806925368681023, -17.12625673247854),
}


@pytest.mark.parametrize("case", CASES)
def test_every_method_trains_exactly_as_before_the_registry(tmp_path, case):
    assert final_digest(tmp_path, CASES[case]) == pytest.approx(RECORDED[case], rel=1e-6, abs=1e-9)
