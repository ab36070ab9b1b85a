#!/usr/bin/python3
"""The PyTorch anchor of examples/spam_assassin.json: the same model on the same tokens, split
and vocabulary (examples/spam_data.py's train.ids and test.ids), with Keras' defaults where
Keras and PyTorch differ, so that the two test accuracies and AUCs can be compared.

Model: Embedding(20002, 64) initialised uniform in [-0.05, 0.05] (Keras' RandomUniform), the
mean over the tokens that are not padding (id 0; zeros for a message of none, as Stratum's
masked GlobalAveragePooling1D), Linear(64, 1) with Glorot-uniform weights and a zero bias,
a sigmoid and binary cross-entropy on its logits; Adam(lr 1e-3, eps 1e-7 as Keras'); batch
32, the training set shuffled every epoch.

Usage: bench/spam_torch.py DATA_DIR [--epochs 10] [--seed 1] [--threads 1]
Prints one JSON line: test_accuracy, test_auc (Keras' AUC: ROC, 200 thresholds,
interpolation), examples_per_sec."""
import argparse
import json
import os
import time

import torch


def read_ids(path, length=256):
    labels, rows = [], []
    with open(path) as f:
        for line in f:
            values = [int(v) for v in line.split()]
            labels.append(values[0])
            ids = values[1:length + 1]
            rows.append(ids + [0] * (length - len(ids)))
    return torch.tensor(rows, dtype=torch.long), torch.tensor(labels, dtype=torch.float32)


class SpamFilter(torch.nn.Module):
    def __init__(self, vocabulary, width=64):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocabulary, width)
        torch.nn.init.uniform_(self.embedding.weight, -0.05, 0.05)
        self.dense = torch.nn.Linear(width, 1)
        torch.nn.init.xavier_uniform_(self.dense.weight)
        torch.nn.init.zeros_(self.dense.bias)

    def forward(self, ids):
        mask = (ids != 0).unsqueeze(-1).float()
        summed = (self.embedding(ids) * mask).sum(1)
        mean = summed / mask.sum(1).clamp(min=1)
        return self.dense(mean).squeeze(-1)


def keras_auc(probabilities, labels, num_thresholds=200):
    """tf.keras.metrics.AUC() with its defaults, on float32 predictions."""
    epsilon = 1e-7
    thresholds = [0.0 - epsilon] + [(i + 1) / (num_thresholds - 1)
                                    for i in range(num_thresholds - 2)] + [1.0 + epsilon]
    t = torch.tensor(thresholds, dtype=torch.float32).unsqueeze(1)
    predicted = probabilities.unsqueeze(0) > t
    positive = labels.unsqueeze(0) > 0.5
    tp = (predicted & positive).sum(1).double()
    fp = (predicted & ~positive).sum(1).double()
    positives, negatives = positive.sum().double(), (~positive).sum().double()
    if positives == 0 or negatives == 0:
        return 0.0
    recall, fp_rate = tp / positives, fp / negatives
    return float(((fp_rate[:-1] - fp_rate[1:]) * (recall[:-1] + recall[1:]) / 2).sum())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    x_train, y_train = read_ids(os.path.join(args.data, "train.ids"))
    x_test, y_test = read_ids(os.path.join(args.data, "test.ids"))
    with open(os.path.join(args.data, "vocab.txt")) as f:
        vocabulary = 2 + sum(1 for _ in f)
    model = SpamFilter(vocabulary)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    examples, seconds = 0, 0.0
    for _ in range(args.epochs):
        order = torch.randperm(len(x_train))
        start = time.perf_counter()
        for first in range(0, len(order), 32):
            batch = order[first:first + 32]
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            examples += len(batch)
        seconds += time.perf_counter() - start
    with torch.no_grad():
        probabilities = torch.sigmoid(model(x_test))
    accuracy = float(((probabilities > 0.5).float() == y_test).float().mean())
    print(json.dumps({"impl": "pytorch", "seed": args.seed, "epochs": args.epochs,
                      "test_accuracy": accuracy, "test_auc": keras_auc(probabilities, y_test),
                      "examples_per_sec": examples / seconds, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
