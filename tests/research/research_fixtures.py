"""A small hand-written research task for unit tests that do not need the real task suite."""

from __future__ import annotations

from dataclasses import dataclass, field

START = "# --- KNOBS START ---"
END = "# --- KNOBS END ---"

SOURCE = f"""import numpy as np

{START}
MODEL = "ridge"
ALPHA = 1.0
SCALE = True
{END}

MODEL_NAMES = ["ridge", "forest"]


def main() -> None:
    print(MODEL, ALPHA, SCALE)


if __name__ == "__main__":
    main()
"""


@dataclass
class FakeTask:
    """The fields of wmrl_research.tasks.ResearchTask that the agent side reads."""

    id: str = "toy-regression"
    split: str = "train"
    kind: str = "tabular-regression"
    description: str = "Predict the target of a small tabular regression set; lower RMSE is better."
    metric: str = "rmse"
    direction: int = -1
    baseline_source: str = SOURCE
    reference_source: str = SOURCE
    knob_space: dict = field(
        default_factory=lambda: {
            "MODEL": ["ridge", "forest", "knn"],
            "ALPHA": [0.1, 1.0, 10.0],
            "SCALE": [True, False],
        }
    )
    baseline_score: float = 1.0
    reference_score: float = 0.5

    def normalise(self, raw: float) -> float:
        return (self.baseline_score - raw) / (self.baseline_score - self.reference_score)
