"""Handwritten digits with a small CNN: baseline solution.

A small convolutional network classifies 8x8 digit images. Trains for a fixed number of epochs (a budget in steps, not seconds, so the score does not
depend on machine load), prints the validation accuracy and writes test labels to predictions.npy.
Edit the knobs block; the rest is the fixed training/evaluation/IO code.
"""

import os

import numpy as np
import torch
from torch import nn

# --- KNOBS START ---
CHANNELS = 4  # convolution channels
DEPTH = 1  # convolution layers (1-3)
DROPOUT = 0.0  # dropout before the classifier
EPOCHS = 1  # passes over the training set (the training budget)
BATCH_SIZE = 64  # examples per step
LR = 0.003  # learning rate
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


def predict(model, X):
    model.eval()
    with torch.no_grad():
        return model(X).argmax(dim=1).numpy()


def main():
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    X_train, y_train = load("train")
    X_val, y_val = load("val")
    X_test, _ = load("test")
    X_train, X_val, X_test = (prepare(X) for X in (X_train, X_val, X_test))
    y_train = torch.as_tensor(y_train, dtype=torch.long)
    n_classes = int(y_train.max()) + 1
    model = build_model(n_classes)
    opt = make_optimizer(model.parameters())
    gen = torch.Generator().manual_seed(SEED)
    for _ in range(EPOCHS):
        model.train()
        order = torch.randperm(len(y_train), generator=gen)
        for i in range(0, len(order), BATCH_SIZE):
            idx = order[i : i + BATCH_SIZE]
            loss = nn.functional.cross_entropy(model(X_train[idx]), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    print(f"val_accuracy={np.mean(predict(model, X_val) == y_val):.4f}")
    np.save("predictions.npy", predict(model, X_test).astype(np.int64))


if __name__ == "__main__":
    main()
