"""Rare positive class detection: baseline solution.

Fits a classifier on train.npz, prints its validation f1, writes test predictions (class
labels) to predictions.npy. Edit the knobs block; the rest is the fixed evaluation/IO code.
"""

import os

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

# --- KNOBS START ---
MODEL = "logreg"  # logreg | knn | forest | hgb
SCALE = True  # standardise the features
C = 1.0  # logreg: inverse regularisation strength
MAX_ITER = 100  # logreg: solver iterations
N_NEIGHBORS = 15  # knn: neighbours
N_ESTIMATORS = 50  # forest: trees / hgb: boosting iterations
MAX_DEPTH = 3  # forest, hgb: tree depth (None: unlimited)
LEARNING_RATE = 0.1  # hgb: shrinkage
CLASS_WEIGHT = None  # None | 'balanced' (logreg, forest, hgb)
THRESHOLD = None  # None: predict(); a float: P(class 1) >= THRESHOLD (binary only)
# --- KNOBS END ---

SEED = 0
DATA_DIR = os.environ.get("WMRL_DATA_DIR", "data")


def load(name):
    d = np.load(os.path.join(DATA_DIR, name + ".npz"))
    return d["X"], (d["y"] if "y" in d.files else None)


def build_model():
    if MODEL == "logreg":
        model = LogisticRegression(C=C, class_weight=CLASS_WEIGHT, max_iter=MAX_ITER)
    elif MODEL == "knn":
        model = KNeighborsClassifier(n_neighbors=N_NEIGHBORS)
    elif MODEL == "forest":
        model = RandomForestClassifier(
            n_estimators=N_ESTIMATORS,
            max_depth=MAX_DEPTH,
            class_weight=CLASS_WEIGHT,
            random_state=SEED,
            n_jobs=1,
        )
    elif MODEL == "hgb":
        model = HistGradientBoostingClassifier(
            max_iter=N_ESTIMATORS,
            max_depth=MAX_DEPTH,
            learning_rate=LEARNING_RATE,
            class_weight=CLASS_WEIGHT,
            random_state=SEED,
        )
    else:
        raise ValueError(f"unknown MODEL {MODEL!r}")
    steps = [SimpleImputer(strategy="median")]
    if SCALE:
        steps.append(StandardScaler())
    return make_pipeline(*steps, model)


def predict(model, X):
    if THRESHOLD is None:
        return model.predict(X)
    return (model.predict_proba(X)[:, 1] >= THRESHOLD).astype(np.int64)


def f1(y, p):
    tp = np.sum((p == 1) & (y == 1))
    fp = np.sum((p == 1) & (y != 1))
    fn = np.sum((p != 1) & (y == 1))
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def main():
    X_train, y_train = load("train")
    X_val, y_val = load("val")
    X_test, _ = load("test")
    model = build_model().fit(X_train, y_train)
    print(f"val_f1={f1(y_val, predict(model, X_val)):.4f}")
    np.save("predictions.npy", predict(model, X_test).astype(np.int64))


if __name__ == "__main__":
    main()
