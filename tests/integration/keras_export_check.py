#!/usr/bin/python3
"""An export of stratum-train --export read back the way Keras 3 would, through h5py (the
HDF5 library Keras itself reads .weights.h5 with) and an independent safetensors reader:

1. model.weights.h5 has Keras 3's layout (keras/src/saving/saving_lib.py): an empty group
   /vars, then /layers/<snake_case(class)>[_n]/vars/0..k-1 per layer of model.layers, the
   paths computed here from model.json with Keras' own naming rule, each a little-endian
   float32 dataset of the layer's variable shapes, nothing else inside any vars group.
2. The same values are in model.safetensors under Stratum's names (<layer name>/<variable>).
3. The weights are the trained ones: a forward pass in NumPy of the exported Dense model on
   Fashion-MNIST's test set gives the test accuracy stratum-train reported.

Usage: keras_export_check.py DIR [--accuracy A --data DIR]; prints one JSON line.
"""
import argparse
import gzip
import json
import re
import struct
import sys

import h5py
import numpy as np


def snake_case(name):  # keras.src.utils.naming.to_snake_case
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def read_safetensors(path):
    data = open(path, "rb").read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        assert entry["dtype"] == "F32", (name, entry["dtype"])
        out[name] = np.frombuffer(data[8 + length + begin:8 + length + end],
                                  dtype="<f4").reshape(entry["shape"])
    return out


def read_idx(path):
    data = gzip.open(path).read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data[4 + 4 * dims:], dtype=np.uint8).reshape(shape)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--accuracy", type=float)
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    model = json.load(open(args.dir + "/model.json"))
    if isinstance(model, str):
        model = json.loads(model)
    weights = read_safetensors(args.dir + "/model.safetensors")
    kernel_order = {"Dense": ["kernel", "bias"], "Conv2D": ["kernel", "bias"],
                    "Embedding": ["embeddings"],
                    "BatchNormalization": ["gamma", "beta", "moving_mean", "moving_variance"]}
    layers, counts = [], {}
    for layer in model["config"]["layers"]:
        if layer["class_name"] == "InputLayer" and model["class_name"] == "Sequential":
            continue
        base = snake_case(layer["class_name"])
        n = counts.get(base, 0)
        counts[base] = n + 1
        layers.append((base if n == 0 else "%s_%d" % (base, n), layer))
    checked = 0
    with h5py.File(args.dir + "/model.weights.h5", "r") as f:
        assert sorted(f.keys()) == ["layers", "vars"], list(f.keys())
        assert isinstance(f["vars"], h5py.Group) and len(f["vars"]) == 0
        assert sorted(f["layers"].keys()) == sorted(p for p, _ in layers), \
            (sorted(f["layers"].keys()), [p for p, _ in layers])
        by_path = {}
        for path, layer in layers:
            vars_group = f["layers"][path]["vars"]
            assert list(f["layers"][path].keys()) == ["vars"], (path, list(f["layers"][path]))
            names = kernel_order.get(layer["class_name"], [])
            present = [n for n in names if "%s/%s" % (layer["config"]["name"], n) in weights]
            assert sorted(vars_group.keys()) == [str(i) for i in range(len(present))], \
                (path, list(vars_group.keys()), present)
            for i, name in enumerate(present):
                dataset = vars_group[str(i)]
                assert dataset.dtype == np.dtype("<f4"), (path, i, dataset.dtype)
                expected = weights["%s/%s" % (layer["config"]["name"], name)]
                assert dataset.shape == expected.shape, (path, i, dataset.shape, expected.shape)
                assert np.array_equal(dataset[()], expected), (path, i)
                checked += 1
            by_path[path] = [vars_group[str(i)][()] for i in range(len(present))]
    result = {"layers": len(layers), "variables": checked}
    if args.accuracy is not None:
        images = read_idx(args.data + "/t10k-images-idx3-ubyte.gz").reshape(10000, -1)
        labels = read_idx(args.data + "/t10k-labels-idx1-ubyte.gz")
        # An Embedding takes the pixels as ids (the job does not rescale them).
        takes_ids = any(layer["class_name"] == "Embedding" for _, layer in layers)
        x = images.astype(np.int64) if takes_ids else images.astype(np.float32) / 255.0
        for path, layer in layers:
            if layer["class_name"] == "Embedding":
                x = by_path[path][0][x]
            elif layer["class_name"] == "Flatten":
                x = x.reshape(len(x), -1)
            elif layer["class_name"] == "Dense":
                kernel, bias = by_path[path]
                x = x @ kernel + bias
                if layer["config"].get("activation") == "relu":
                    x = np.maximum(x, 0)
        accuracy = float(np.mean(np.argmax(x, axis=1) == labels))
        result["accuracy"] = accuracy
        assert abs(accuracy - args.accuracy) < 2e-3, (accuracy, args.accuracy)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
