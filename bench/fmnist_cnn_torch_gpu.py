#!/usr/bin/env python3
"""Anchor on the GPU machine: the CNN of examples/fashion_mnist_cnn.json (Reshape 28x28x1 ->
Conv2D 32 3x3 valid relu -> MaxPool 2x2 -> Flatten -> Dense 64 relu -> Dense 10 logits; Adam 1e-3,
epsilon 1e-7 as Keras'; Keras' initialisers: glorot_uniform kernels, zero biases) trained on
Fashion-MNIST with PyTorch on one GPU, data resident on the GPU, at the given batch sizes.
Prints examples/s (median of epochs 2..N) and test accuracy (in batches of 1000), one line per
batch, as shared/peers/fmnist_torch_gpu.py does, with model=cnn. cudnn.benchmark is on.
--channels_last (or STRATUM_TORCH_CHANNELS_LAST=1) stores activations NHWC; --bf16 (or
STRATUM_TORCH_BF16=1) trains under bf16 autocast and tags its lines torch_gpu_bf16.
Usage: fmnist_cnn_torch_gpu.py DATA_DIR EPOCHS BATCH... [--channels_last] [--bf16]"""
import gzip, os, sys, time, statistics, contextlib, numpy as np, torch

flags = {a for a in sys.argv[1:] if a.startswith("--")}
args = [a for a in sys.argv[1:] if not a.startswith("--")]
d, epochs, batches = args[0].rstrip("/") + "/", int(args[1]), [int(b) for b in args[2:]]
channels_last = "--channels_last" in flags or os.environ.get("STRATUM_TORCH_CHANNELS_LAST") == "1"
bf16 = "--bf16" in flags or os.environ.get("STRATUM_TORCH_BF16") == "1"
tag = "torch_gpu_bf16" if bf16 else "torch_gpu"
fmt = torch.channels_last if channels_last else torch.contiguous_format
torch.backends.cudnn.benchmark = True
nn, dev = torch.nn, torch.device("cuda")


def idx(name, off):
    with gzip.open(d + name) as f: return np.frombuffer(f.read(), np.uint8, offset=off)


def images(name):
    x = idx(name, 16).reshape(-1, 1, 28, 28).astype(np.float32) / 255
    return torch.from_numpy(x).to(dev).contiguous(memory_format=fmt)


X, XT = images("train-images-idx3-ubyte.gz"), images("t10k-images-idx3-ubyte.gz")
Y = torch.from_numpy(idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64)).to(dev)
YT = torch.from_numpy(idx("t10k-labels-idx1-ubyte.gz", 8).astype(np.int64)).to(dev)
autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
print(f"# torch {torch.__version__} cudnn {torch.backends.cudnn.version()} "
      f"channels_last={int(channels_last)} bf16={int(bf16)}", flush=True)
for bs in batches:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(32 * 13 * 13, 64), nn.ReLU(), nn.Linear(64, 10))
    for mod in m.modules():
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(mod.weight)
            nn.init.zeros_(mod.bias)
    m = m.to(dev, memory_format=fmt)
    opt = torch.optim.Adam(m.parameters(), 1e-3, eps=1e-7); lossf = nn.CrossEntropyLoss(); rates = []
    for e in range(epochs):
        perm = torch.randperm(len(X), device=dev); torch.cuda.synchronize(); t = time.perf_counter()
        for i in range(0, len(X) - bs + 1, bs):
            b = perm[i:i + bs]; opt.zero_grad(set_to_none=True)
            with autocast(): l = lossf(m(X[b].contiguous(memory_format=fmt)), Y[b])
            l.backward(); opt.step()
        torch.cuda.synchronize(); rates.append((len(X) // bs) * bs / (time.perf_counter() - t))
    with torch.no_grad(), autocast():
        correct = sum((m(XT[j:j + 1000]).argmax(1) == YT[j:j + 1000]).sum().item() for j in range(0, len(XT), 1000))
    print(f"{tag} model=cnn batch={bs} examples_per_s={statistics.median(rates[1:] or rates):.0f} "
          f"test_acc={correct / len(XT):.4f} device={torch.cuda.get_device_name()}", flush=True)
