"""Long-range motif detection with a recurrent network: baseline solution.

A recurrent network (optionally stacked, bidirectional) reads long token sequences and detects a gapped motif; gradients are clipped. Trains for a fixed number of epochs (a budget in steps, not seconds, so the score does not
depend on machine load), prints the validation accuracy and writes test labels to predictions.npy.
Edit the knobs block; the rest is the fixed training/evaluation/IO code.
"""

import os

import numpy as np
import torch
from torch import nn

# --- KNOBS START ---
CELL = "rnn"  # rnn | gru | lstm
EMBED = 16  # token embedding size
HIDDEN = 32  # recurrent state size
LAYERS = 1  # stacked recurrent layers
BIDIRECTIONAL = False  # read the sequence both ways
POOL = "last"  # last: final state | max: max over time
CLIP = 1.0  # gradient-norm clipping
EPOCHS = 4  # passes over the training set (the training budget)
BATCH_SIZE = 64  # examples per step
LR = 0.001  # learning rate
OPTIMIZER = "adam"  # sgd (momentum 0.9) | adam
WEIGHT_DECAY = 0.0  # L2 penalty
# --- KNOBS END ---

SEED = 0
DATA_DIR = os.environ.get("WMRL_DATA_DIR", "data")


def load(name):
    d = np.load(os.path.join(DATA_DIR, name + ".npz"))
    return d["X"], (d["y"] if "y" in d.files else None)


VOCAB = 16


def prepare(X):
    return torch.as_tensor(X, dtype=torch.long)


class SequenceClassifier(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMBED)
        cell = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}[CELL]
        self.rnn = cell(EMBED, HIDDEN, num_layers=LAYERS, bidirectional=BIDIRECTIONAL, batch_first=True)
        self.head = nn.Linear(HIDDEN * (2 if BIDIRECTIONAL else 1), n_classes)

    def forward(self, x):  # x: [batch, time] token ids
        out, _ = self.rnn(self.embed(x))  # [batch, time, HIDDEN * directions]
        pooled = out.max(dim=1).values if POOL == "max" else out[:, -1]
        return self.head(pooled)


def build_model(n_classes):
    return SequenceClassifier(n_classes)


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
            nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
    print(f"val_accuracy={np.mean(predict(model, X_val) == y_val):.4f}")
    np.save("predictions.npy", predict(model, X_test).astype(np.int64))


if __name__ == "__main__":
    main()
