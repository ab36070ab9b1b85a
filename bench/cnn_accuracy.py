#!/usr/bin/python3
"""Accuracy of the CNN of TensorFlow's "Custom training with tf.distribute.Strategy" tutorial
(examples/fashion_mnist_cnn_custom.json without its L2 regularizers, as the anchor has none:
Conv2D 32 -> MaxPool -> Conv2D 64 -> MaxPool -> Dense 64 -> Dense 10, Adam 1e-3, batch 64)
trained by stratum-train on one replica, beside the anchor ../shared/peers/fmnist_cnn_torch.py
(PyTorch with Keras' initialisers and Adam), over the same seeds, side by side: one of ours
and one of the anchor's at a time, one thread each, on this 2-core machine.

Usage: bench/cnn_accuracy.py [--epochs 10] [--seeds 1,2,3,4,5] [--build build]
Prints one JSON line per run, then the means beside the goal (within 0.005).
"""
import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANCHOR = os.path.join(ROOT, "..", "shared", "peers", "fmnist_cnn_torch.py")


def job_for(seed, epochs):
    with open(os.path.join(ROOT, "examples", "fashion_mnist_cnn_custom.json")) as f:
        job = json.load(f)
    model = job["model"] if isinstance(job["model"], dict) else json.loads(job["model"])
    for layer in model["config"]["layers"]:
        layer["config"].pop("kernel_regularizer", None)
    job["model"] = model
    job["strategy"] = {"type": "default"}
    job["fit"].update({"epochs": epochs, "batch_size_per_replica": 64, "seed": seed,
                       "validate": False})
    return job


def run_stratum(build, seed, epochs):
    with tempfile.TemporaryDirectory() as tmp:
        job_path, summary_path = os.path.join(tmp, "job.json"), os.path.join(tmp, "summary.json")
        with open(job_path, "w") as f:
            json.dump(job_for(seed, epochs), f)
        subprocess.run([os.path.join(build, "bin", "stratum-train"), "--job=" + job_path,
                        "--summary_json=" + summary_path], check=True, capture_output=True)
        with open(summary_path) as f:
            summary = json.load(f)
    return {"impl": "stratum", "seed": seed, "test_accuracy": summary["test_accuracy"],
            "examples_per_sec": summary.get("examples_per_sec")}


def run_anchor(seed, epochs):
    out = subprocess.run([sys.executable, ANCHOR, str(epochs), "1", str(seed)], check=True,
                         capture_output=True, text=True).stdout
    last = out.strip().splitlines()[-1]
    accuracy = float(re.search(r"test_acc ([0-9.]+)", last).group(1))
    speed = float(re.search(r"samples_per_s ([0-9.]+)", last).group(1))
    return {"impl": "pytorch", "seed": seed, "test_accuracy": accuracy, "examples_per_sec": speed}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    results = {"stratum": [], "pytorch": []}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for seed in seeds:
            ours = pool.submit(run_stratum, args.build, seed, args.epochs)
            theirs = pool.submit(run_anchor, seed, args.epochs)
            for result in (ours.result(), theirs.result()):
                print(json.dumps(result), flush=True)
                results[result["impl"]].append(result["test_accuracy"])
    ours, theirs = statistics.mean(results["stratum"]), statistics.mean(results["pytorch"])
    print(json.dumps({"name": "cnn_accuracy", "epochs": args.epochs, "seeds": seeds,
                      "stratum_mean": round(ours, 5), "pytorch_mean": round(theirs, 5),
                      "difference": round(ours - theirs, 5), "goal_abs_difference": 0.005}))


if __name__ == "__main__":
    main()
