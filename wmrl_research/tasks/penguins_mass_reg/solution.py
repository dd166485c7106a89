"""Penguin body mass regression: baseline solution.

Fits a regressor on train.npz, prints its validation RMSE, writes test predictions to
predictions.npy. Edit the knobs block; the rest is the fixed evaluation/IO code.
"""

import os

import numpy as np
from sklearn.ensemble import HistGradientBoostingRegressor, RandomForestRegressor
from sklearn.impute import SimpleImputer
from sklearn.linear_model import Ridge
from sklearn.neighbors import KNeighborsRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import PolynomialFeatures, StandardScaler

# --- KNOBS START ---
MODEL = "knn"  # ridge | knn | forest | hgb
ALPHA = 1.0  # ridge: L2 penalty
SCALE = False  # standardise the features
POLY_DEGREE = 1  # 1: raw features; 2: add pairwise products and squares
LOG_TARGET = False  # fit log(y) and predict exp()
N_NEIGHBORS = 5  # knn: neighbours
N_ESTIMATORS = 50  # forest: trees / hgb: boosting iterations
MAX_DEPTH = 3  # forest, hgb: tree depth (None: unlimited)
LEARNING_RATE = 0.1  # hgb: shrinkage
# --- KNOBS END ---

SEED = 0
DATA_DIR = os.environ.get("WMRL_DATA_DIR", "data")


def load(name):
    d = np.load(os.path.join(DATA_DIR, name + ".npz"))
    return d["X"], (d["y"] if "y" in d.files else None)


def build_model():
    if MODEL == "ridge":
        model = Ridge(alpha=ALPHA)
    elif MODEL == "knn":
        model = KNeighborsRegressor(n_neighbors=N_NEIGHBORS)
    elif MODEL == "forest":
        model = RandomForestRegressor(
            n_estimators=N_ESTIMATORS, max_depth=MAX_DEPTH, random_state=SEED, n_jobs=1
        )
    elif MODEL == "hgb":
        model = HistGradientBoostingRegressor(
            max_iter=N_ESTIMATORS, max_depth=MAX_DEPTH, learning_rate=LEARNING_RATE, random_state=SEED
        )
    else:
        raise ValueError(f"unknown MODEL {MODEL!r}")
    steps = [SimpleImputer(strategy="median")]
    if POLY_DEGREE > 1:
        steps.append(PolynomialFeatures(degree=POLY_DEGREE, include_bias=False))
    if SCALE:
        steps.append(StandardScaler())
    return make_pipeline(*steps, model)


def rmse(y, p):
    return float(np.sqrt(np.mean((p - y) ** 2)))


def main():
    X_train, y_train = load("train")
    X_val, y_val = load("val")
    X_test, _ = load("test")
    if LOG_TARGET:
        model = build_model().fit(X_train, np.log(y_train))
        predict = lambda X: np.exp(model.predict(X))  # noqa: E731
    else:
        model = build_model().fit(X_train, y_train)
        predict = model.predict
    print(f"val_rmse={rmse(y_val, predict(X_val)):.4f}")
    np.save("predictions.npy", predict(X_test).astype(np.float64))


if __name__ == "__main__":
    main()
