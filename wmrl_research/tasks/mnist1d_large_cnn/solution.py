"""MNIST-1D (a large sample) with a 1-D CNN and a learning-rate schedule: baseline solution.

A 1-D convolutional network classifies MNIST-1D series; the learning rate follows a schedule over
the whole run. Trains for a fixed number of epochs (a budget in steps, not seconds, so the score
does not depend on machine load), prints the validation accuracy and writes test labels to
predictions.npy. Edit the knobs block; the rest is the fixed training/evaluation/IO code.
"""

import os

import numpy as np
import torch
from torch import nn

# --- KNOBS START ---
CHANNELS = 32  # convolution channels
DEPTH = 2  # strided convolution layers (1-3)
KERNEL = 5  # convolution kernel size
DROPOUT = 0.0  # dropout before the classifier
EPOCHS = 6  # passes over the training set (the training budget)
BATCH_SIZE = 32  # examples per step
LR = 0.0003  # peak learning rate
SCHEDULE = "constant"  # constant | cosine (decay to 0 over the run) | onecycle (warm-up, then decay)
OPTIMIZER = "sgd"  # sgd (momentum 0.9) | adam
WEIGHT_DECAY = 0.0  # L2 penalty
# --- KNOBS END ---

SEED = 0
DATA_DIR = os.environ.get("WMRL_DATA_DIR", "data")


def load(name):
    d = np.load(os.path.join(DATA_DIR, name + ".npz"))
    return d["X"], (d["y"] if "y" in d.files else None)


def prepare(X):
    return torch.as_tensor(X, dtype=torch.float32).unsqueeze(1)


def build_model(n_classes):
    layers, channels = [], 1
    for _ in range(DEPTH):
        layers += [nn.Conv1d(channels, CHANNELS, KERNEL, stride=2, padding=KERNEL // 2), nn.ReLU()]
        channels = CHANNELS
    layers += [nn.Flatten(), nn.Dropout(DROPOUT)]
    n_features = nn.Sequential(*layers)(torch.zeros(1, 1, 40)).shape[1]
    return nn.Sequential(*layers, nn.Linear(n_features, n_classes))


def make_optimizer(params):
    if OPTIMIZER == "adam":
        return torch.optim.Adam(params, lr=LR, weight_decay=WEIGHT_DECAY)
    if OPTIMIZER == "sgd":
        return torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=WEIGHT_DECAY)
    raise ValueError(f"unknown OPTIMIZER {OPTIMIZER!r}")


def make_schedule(opt, total_steps):
    if SCHEDULE == "constant":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    if SCHEDULE == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total_steps)
    if SCHEDULE == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=total_steps)
    raise ValueError(f"unknown SCHEDULE {SCHEDULE!r}")


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
    steps_per_epoch = (len(y_train) + BATCH_SIZE - 1) // BATCH_SIZE
    schedule = make_schedule(opt, EPOCHS * steps_per_epoch)
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
            schedule.step()
    print(f"val_accuracy={np.mean(predict(model, X_val) == y_val):.4f}")
    np.save("predictions.npy", predict(model, X_test).astype(np.int64))


if __name__ == "__main__":
    main()
