"""A generated multi-class problem with a multi-layer perceptron: baseline solution.

Standardises the features, trains scikit-learn's MLPClassifier for a fixed number of
epochs (a budget in passes over the data, not seconds, so the score does not depend on machine
load), prints the validation accuracy and writes test labels to predictions.npy. Edit the knobs
block; the rest is the fixed training/evaluation/IO code.
"""

import os
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

# --- KNOBS START ---
HIDDEN = 64  # units per hidden layer
LAYERS = 1  # hidden layers
ACTIVATION = "relu"  # relu | tanh | logistic
ALPHA = 0.0001  # L2 penalty
LR = 0.0001  # initial learning rate (adam)
BATCH_SIZE = 64  # examples per step
EPOCHS = 40  # passes over the training set (the training budget)
# --- KNOBS END ---

SEED = 0
DATA_DIR = os.environ.get("WMRL_DATA_DIR", "data")


def load(name):
    d = np.load(os.path.join(DATA_DIR, name + ".npz"))
    return d["X"], (d["y"] if "y" in d.files else None)


def main():
    X_train, y_train = load("train")
    X_val, y_val = load("val")
    X_test, _ = load("test")
    scaler = StandardScaler().fit(X_train)
    model = MLPClassifier(
        hidden_layer_sizes=(HIDDEN,) * LAYERS,
        activation=ACTIVATION,
        alpha=ALPHA,
        learning_rate_init=LR,
        batch_size=BATCH_SIZE,
        max_iter=EPOCHS,
        n_iter_no_change=EPOCHS + 1,  # no early stop: exactly EPOCHS passes
        tol=0.0,
        random_state=SEED,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(scaler.transform(X_train), y_train)
    predict = lambda X: model.predict(scaler.transform(X))  # noqa: E731
    print(f"val_accuracy={np.mean(predict(X_val) == y_val):.4f}")
    np.save("predictions.npy", predict(X_test).astype(np.int64))


if __name__ == "__main__":
    main()
