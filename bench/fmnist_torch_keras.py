#!/usr/bin/python3
"""The reference job in PyTorch with Keras' semantics, for train_bench's accuracy figures.

shared/peers/fmnist_torch.py trains the same model with PyTorch's defaults; Keras (and
Stratum, which follows it) differ in ways that move the test accuracy after 10 epochs by
about as much as the seed does: GlorotUniform kernels and zero biases (PyTorch: uniform
+-1/sqrt(fan_in) for both), Keras' Adam (epsilon 1e-7 added to sqrt(v) before the bias
correction, which Keras folds into the step size; PyTorch: 1e-8 added after it), and the
last partial batch of each epoch trained (the anchor drops it). This script makes those choices as Keras does,
so that the accuracy of the two implementations can be compared like for like.

Usage: fmnist_torch_keras.py EPOCHS SEEDS THREADS   (SEEDS: comma-separated)
Prints one line per seed: "seed S test_acc A".
"""
import gzip
import sys

import numpy as np
import torch

DATA = "/usr/share/datasets/fashion-mnist/"


def read_idx(name, offset):
    with gzip.open(DATA + name) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def main():
    epochs, seeds, threads = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
    torch.set_num_threads(threads)
    x_train = torch.from_numpy(read_idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 784).astype(np.float32) / 255)
    y_train = torch.from_numpy(read_idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    x_test = torch.from_numpy(read_idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784).astype(np.float32) / 255)
    y_test = read_idx("t10k-labels-idx1-ubyte.gz", 8).astype(np.int64)
    for seed in seeds:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        for layer in (model[0], model[2]):
            torch.nn.init.xavier_uniform_(layer.weight)  # Keras' GlorotUniform
            torch.nn.init.zeros_(layer.bias)
        params = list(model.parameters())
        m = [torch.zeros_like(p) for p in params]
        v = [torch.zeros_like(p) for p in params]
        loss_fn = torch.nn.CrossEntropyLoss()  # softmax + cross-entropy fused, as Keras does
        step = 0
        for _ in range(epochs):
            order = torch.randperm(len(x_train))
            for first in range(0, len(x_train), 64):
                batch = order[first:first + 64]
                model.zero_grad()
                loss_fn(model(x_train[batch]), y_train[batch]).backward()
                step += 1
                alpha = 1e-3 * (1 - 0.999 ** step) ** 0.5 / (1 - 0.9 ** step)
                with torch.no_grad():  # Keras' Adam update
                    for p, m_p, v_p in zip(params, m, v):
                        m_p.add_((p.grad - m_p) * 0.1)
                        v_p.add_((p.grad * p.grad - v_p) * 0.001)
                        p.sub_(alpha * m_p / (v_p.sqrt() + 1e-7))
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1).numpy() == y_test).mean()
        print(f"seed {seed} test_acc {accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
