"""Handwritten digits with a CNN ensemble over cross-validation folds: baseline solution.

A convolutional network classifies 8x8 digit images, trained once per cross-validation fold (each
fold's model trains on the other folds and is scored on its own: the printed CV accuracy); the test
predictions average the fold models' class probabilities. With FOLDS = 1 one model trains on the
whole training set. Budgets are in epochs (not seconds, so the score does not depend on machine
load). Prints the CV and validation accuracy and writes test labels to predictions.npy. Edit the
knobs block; the rest is the fixed training/evaluation/IO code.
"""

import os

import numpy as np
import torch
from torch import nn

# --- KNOBS START ---
CHANNELS = 16  # convolution channels
DEPTH = 2  # convolution layers (1-3)
DROPOUT = 0.0  # dropout before the classifier
SHIFT = 0  # data augmentation: random shifts of up to this many pixels per batch
FOLDS = 3  # cross-validation folds (models in the ensemble); 1: one model on all training data
EPOCHS = 20  # passes over each fold's training data (the training budget)
BATCH_SIZE = 32  # examples per step
LR = 0.0003  # learning rate
OPTIMIZER = "sgd"  # sgd (momentum 0.9) | adam
WEIGHT_DECAY = 0.0  # L2 penalty
# --- KNOBS END ---

SEED = 0
DATA_DIR = os.environ.get("WMRL_DATA_DIR", "data")


def load(name):
    d = np.load(os.path.join(DATA_DIR, name + ".npz"))
    return d["X"], (d["y"] if "y" in d.files else None)


def prepare(X):
    return torch.as_tensor(X, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0


def build_model(n_classes):
    layers = [nn.Conv2d(1, CHANNELS, 3, padding=1), nn.ReLU()]
    for _ in range(DEPTH - 1):
        layers += [nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1), nn.ReLU()]
    layers += [nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(DROPOUT), nn.Linear(CHANNELS * 16, n_classes)]
    return nn.Sequential(*layers)


def make_optimizer(params):
    if OPTIMIZER == "adam":
        return torch.optim.Adam(params, lr=LR, weight_decay=WEIGHT_DECAY)
    if OPTIMIZER == "sgd":
        return torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=WEIGHT_DECAY)
    raise ValueError(f"unknown OPTIMIZER {OPTIMIZER!r}")


def augment(x, gen):
    if SHIFT == 0:
        return x
    dx, dy = (int(v) for v in torch.randint(-SHIFT, SHIFT + 1, (2,), generator=gen))
    return torch.roll(x, shifts=(dy, dx), dims=(2, 3))


def train(X, y, n_classes, gen):
    model = build_model(n_classes)
    opt = make_optimizer(model.parameters())
    for _ in range(EPOCHS):
        model.train()
        order = torch.randperm(len(y), generator=gen)
        for i in range(0, len(order), BATCH_SIZE):
            idx = order[i : i + BATCH_SIZE]
            loss = nn.functional.cross_entropy(model(augment(X[idx], gen)), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model


def probabilities(model, X):
    model.eval()
    with torch.no_grad():
        return torch.softmax(model(X), dim=1).numpy()


def main():
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    X_train, y_train = load("train")
    X_val, y_val = load("val")
    X_test, _ = load("test")
    X_train, X_val, X_test = (prepare(X) for X in (X_train, X_val, X_test))
    y_train = torch.as_tensor(y_train, dtype=torch.long)
    n_classes = int(y_train.max()) + 1
    gen = torch.Generator().manual_seed(SEED)
    folds = np.array_split(np.random.default_rng(SEED).permutation(len(y_train)), FOLDS)
    models, cv_correct = [], 0
    for k in range(FOLDS):
        fit = np.concatenate([f for j, f in enumerate(folds) if j != k]) if FOLDS > 1 else folds[0]
        model = train(X_train[fit], y_train[fit], n_classes, gen)
        if FOLDS > 1:
            held = folds[k]
            cv_correct += int((probabilities(model, X_train[held]).argmax(1) == y_train[held].numpy()).sum())
        models.append(model)
    if FOLDS > 1:
        print(f"cv_accuracy={cv_correct / len(y_train):.4f}")
    ensemble = lambda X: np.mean([probabilities(m, X) for m in models], axis=0)  # noqa: E731
    print(f"val_accuracy={np.mean(ensemble(X_val).argmax(1) == y_val):.4f}")
    np.save("predictions.npy", ensemble(X_test).argmax(1).astype(np.int64))


if __name__ == "__main__":
    main()
