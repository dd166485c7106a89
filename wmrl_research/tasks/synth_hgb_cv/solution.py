"""A large generated tabular problem with gradient-boosted trees bagged over CV folds: baseline solution.

One histogram gradient-boosting model is trained per cross-validation fold (on the other folds;
the printed CV accuracy scores each on its own fold); the test predictions average the fold
models' class probabilities. With FOLDS = 1 one model trains on the whole training set. Budgets are
in boosting iterations (not seconds, so the score does not depend on machine load). Prints the CV
and validation accuracy and writes test labels to predictions.npy. Edit the knobs block; the rest is
the fixed training/evaluation/IO code.
"""

import os

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.model_selection import StratifiedKFold

# --- KNOBS START ---
LEARNING_RATE = 0.01  # shrinkage per boosting iteration
MAX_ITER = 100  # boosting iterations per model (the training budget)
MAX_LEAF_NODES = 15  # leaves per tree
MIN_SAMPLES_LEAF = 20  # minimum training rows per leaf
L2 = 0.0  # L2 regularisation of the leaf values
MAX_FEATURES = 1.0  # fraction of features considered at each split
FOLDS = 3  # cross-validation folds (models in the bag); 1: one model on all training data
# --- KNOBS END ---

SEED = 0
DATA_DIR = os.environ.get("WMRL_DATA_DIR", "data")


def load(name):
    d = np.load(os.path.join(DATA_DIR, name + ".npz"))
    return d["X"], (d["y"] if "y" in d.files else None)


def make_model():
    return HistGradientBoostingClassifier(
        learning_rate=LEARNING_RATE,
        max_iter=MAX_ITER,
        max_leaf_nodes=MAX_LEAF_NODES,
        min_samples_leaf=MIN_SAMPLES_LEAF,
        l2_regularization=L2,
        max_features=MAX_FEATURES,
        early_stopping=False,
        random_state=SEED,
    )


def main():
    X_train, y_train = load("train")
    X_val, y_val = load("val")
    X_test, _ = load("test")
    if FOLDS == 1:
        models = [make_model().fit(X_train, y_train)]
    else:
        models, cv_correct = [], 0
        for fit, held in StratifiedKFold(FOLDS, shuffle=True, random_state=SEED).split(X_train, y_train):
            model = make_model().fit(X_train[fit], y_train[fit])
            cv_correct += int(np.sum(model.predict(X_train[held]) == y_train[held]))
            models.append(model)
        print(f"cv_accuracy={cv_correct / len(y_train):.4f}")
    classes = models[0].classes_
    ensemble = lambda X: classes[np.mean([m.predict_proba(X) for m in models], axis=0).argmax(1)]  # noqa: E731
    print(f"val_accuracy={np.mean(ensemble(X_val) == y_val):.4f}")
    np.save("predictions.npy", ensemble(X_test).astype(np.int64))


if __name__ == "__main__":
    main()
