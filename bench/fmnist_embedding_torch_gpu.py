#!/usr/bin/env python3
"""Anchor on the GPU machine: the model of examples/fashion_mnist_embedding.json (each pixel's
intensity 0..255 an id, int64, not rescaled -> Embedding 256x4, uniform in -0.05..0.05 as Keras'
RandomUniform -> Flatten -> Dense 64 relu -> Dense 10 logits; Adam 1e-3, epsilon 1e-7 as Keras';
glorot_uniform kernels, zero biases) trained on Fashion-MNIST with PyTorch on one GPU, data
resident on the GPU, at the given batch sizes. Prints examples/s (median of epochs 2..N) and test
accuracy (in batches of 1000), one line per batch, as bench/fmnist_cnn_torch_gpu.py does, with
model=embedding.
Usage: fmnist_embedding_torch_gpu.py DATA_DIR EPOCHS BATCH..."""
import gzip, sys, time, statistics, numpy as np, torch

d, epochs, batches = sys.argv[1].rstrip("/") + "/", int(sys.argv[2]), [int(b) for b in sys.argv[3:]]
nn, dev = torch.nn, torch.device("cuda")


def idx(name, off):
    with gzip.open(d + name) as f: return np.frombuffer(f.read(), np.uint8, offset=off)


def ids(name):
    return torch.from_numpy(idx(name, 16).reshape(-1, 784).astype(np.int64)).to(dev)


X, XT = ids("train-images-idx3-ubyte.gz"), ids("t10k-images-idx3-ubyte.gz")
Y = torch.from_numpy(idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64)).to(dev)
YT = torch.from_numpy(idx("t10k-labels-idx1-ubyte.gz", 8).astype(np.int64)).to(dev)
print(f"# torch {torch.__version__}", flush=True)
for bs in batches:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Embedding(256, 4), nn.Flatten(), nn.Linear(784 * 4, 64), nn.ReLU(),
                      nn.Linear(64, 10))
    for mod in m.modules():
        if isinstance(mod, nn.Embedding):
            nn.init.uniform_(mod.weight, -0.05, 0.05)
        elif isinstance(mod, nn.Linear):
            nn.init.xavier_uniform_(mod.weight)
            nn.init.zeros_(mod.bias)
    m = m.to(dev)
    opt = torch.optim.Adam(m.parameters(), 1e-3, eps=1e-7); lossf = nn.CrossEntropyLoss(); rates = []
    for e in range(epochs):
        perm = torch.randperm(len(X), device=dev); torch.cuda.synchronize(); t = time.perf_counter()
        for i in range(0, len(X) - bs + 1, bs):
            b = perm[i:i + bs]; opt.zero_grad(set_to_none=True)
            l = lossf(m(X[b]), Y[b]); l.backward(); opt.step()
        torch.cuda.synchronize(); rates.append((len(X) // bs) * bs / (time.perf_counter() - t))
    with torch.no_grad():
        correct = sum((m(XT[j:j + 1000]).argmax(1) == YT[j:j + 1000]).sum().item() for j in range(0, len(XT), 1000))
    print(f"torch_gpu model=embedding batch={bs} examples_per_s={statistics.median(rates[1:] or rates):.0f} "
          f"test_acc={correct / len(XT):.4f} device={torch.cuda.get_device_name()}", flush=True)
