"""Waveform shape classification: baseline solution.

Each row of X is one univariate series; y is its class. Turns each series into features, fits a
classifier, prints the validation accuracy and writes test labels to predictions.npy. Edit the
knobs block; the rest is the fixed evaluation/IO code.
"""

import os

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

# --- KNOBS START ---
FEATURES = "raw"  # raw | fft | stats
NORMALISE = False  # z-normalise each series
N_FREQS = 16  # fft: how many low-frequency magnitudes
MODEL = "logreg"  # logreg | knn | forest | hgb
C = 1.0  # logreg: inverse regularisation strength
N_NEIGHBORS = 5  # knn: neighbours
N_ESTIMATORS = 50  # forest: trees / hgb: boosting iterations
# --- KNOBS END ---

SEED = 0
DATA_DIR = os.environ.get("WMRL_DATA_DIR", "data")


def load(name):
    d = np.load(os.path.join(DATA_DIR, name + ".npz"))
    return d["X"], (d["y"] if "y" in d.files else None)


def featurise(X):
    if NORMALISE:
        X = (X - X.mean(axis=1, keepdims=True)) / (X.std(axis=1, keepdims=True) + 1e-8)
    if FEATURES == "raw":
        return X
    if FEATURES == "fft":
        return np.abs(np.fft.rfft(X, axis=1))[:, :N_FREQS]
    if FEATURES == "stats":
        d = np.diff(X, axis=1)
        return np.stack(
            [
                X.mean(1),
                X.std(1),
                X.min(1),
                X.max(1),
                np.abs(d).mean(1),
                d.std(1),
                ((X[:, 1:] * X[:, :-1]) < 0).mean(1),
            ],
            axis=1,
        )
    raise ValueError(f"unknown FEATURES {FEATURES!r}")


def build_model():
    if MODEL == "logreg":
        model = LogisticRegression(C=C, max_iter=1000)
    elif MODEL == "knn":
        model = KNeighborsClassifier(n_neighbors=N_NEIGHBORS)
    elif MODEL == "forest":
        model = RandomForestClassifier(n_estimators=N_ESTIMATORS, random_state=SEED, n_jobs=1)
    elif MODEL == "hgb":
        model = HistGradientBoostingClassifier(max_iter=N_ESTIMATORS, random_state=SEED)
    else:
        raise ValueError(f"unknown MODEL {MODEL!r}")
    return make_pipeline(StandardScaler(), model)


def main():
    X_train, y_train = load("train")
    X_val, y_val = load("val")
    X_test, _ = load("test")
    model = build_model().fit(featurise(X_train), y_train)
    print(f"val_accuracy={np.mean(model.predict(featurise(X_val)) == y_val):.4f}")
    np.save("predictions.npy", model.predict(featurise(X_test)).astype(np.int64))


if __name__ == "__main__":
    main()
