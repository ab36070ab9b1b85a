#!/usr/bin/python3
"""The synthetic click-through workload (issue 31's "Scale"): examples/ctr.json, a table of
2^23 x 32 float32 (1 GiB) split into 128 MiB shards over 2 parameter servers, trained by
stratum-launch with 1 and then 2 workers on data bench/ctr_data writes, while this script
samples every process's peak RSS (VmHWM) every 0.25 s.

Then the same model on a table of 2^20 rows under MultiWorkerMirrored with 2 workers, whose
worker:0 logs what the embedding table's exchange all-reduced per step (the rows the workers
read, then their gradients) beside what a dense all-reduce of the table would.

With --checkpoint, the table is also saved after one epoch and restored by a run that
trains a second, with each ps task's peak RSS beside the state it holds.

Usage: bench/ctr_bench.py [--build build] [--data /tmp/stratum_ctr] [--train 1000000]
                          [--test 50000] [--workers 1,2] [--ps 2] [--rows 8388608]
                          [--rounds 3] [--mwms_rows 1048576] [--checkpoint]
Each worker count runs --rounds times, taking turns, and its median run counts. Prints one
JSON line per run (examples/s, test AUC beside the best reachable, the peak RSS
of each role; the exchange's bytes), then the figures beside their goals: 2 workers >= 1.6x
the examples/s of 1 worker, a worker's peak RSS under 200 MiB, and the sparse exchange
under a fifth of the dense all-reduce's bytes."""
import argparse
import json
import os
import re
import subprocess
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20


def peak_rss_by_role(launcher, stop, peaks):
    """Until `stop`: the highest VmHWM of each child of `launcher`, by role and pid."""
    while not stop.is_set():
        try:
            children = open("/proc/%d/task/%d/children" % (launcher, launcher)).read().split()
        except OSError:
            children = []
        for pid in children:
            try:
                binary = os.path.basename(open("/proc/%s/cmdline" % pid).read().split("\0")[0])
                for line in open("/proc/%s/status" % pid):
                    if line.startswith("VmHWM:"):
                        kib = int(line.split()[1])
                        key = (binary.replace("stratum-", ""), pid)
                        peaks[key] = max(peaks.get(key, 0), kib * 1024)
            except (OSError, IndexError, ValueError):
                pass  # the process ended between the listing and the read
        stop.wait(0.25)


def write_data(build, data, rows, train, test):
    marker = os.path.join(data, "best_auc.json")
    if os.path.exists(marker):
        with open(marker) as f:
            made = json.load(f)
        if made.get("args") == [rows, train, test]:
            return made["best_test_auc"]
    out = subprocess.run([os.path.join(build, "bin", "ctr_data"), "--out", data, "--rows",
                          str(rows), "--train", str(train), "--test", str(test)],
                         check=True, capture_output=True, text=True).stdout
    best = None
    for line in out.splitlines():
        try:
            best = json.loads(line).get("best_test_auc", best)
        except ValueError:
            pass
    with open(marker, "w") as f:
        json.dump({"args": [rows, train, test], "best_test_auc": best}, f)
    return best


def ctr_job(data, rows):
    """examples/ctr.json for one epoch of `data`'s files, on a table of `rows` rows."""
    with open(os.path.join(ROOT, "examples", "ctr.json")) as f:
        job = json.load(f)
    job["data"]["train"]["files"] = [os.path.join(data, "train-*.tfrecord")]
    job["data"]["test"]["files"] = [os.path.join(data, "test.tfrecord")]
    job["model"]["config"]["layers"][1]["config"]["input_dim"] = rows
    job["fit"]["epochs"] = 1
    job.pop("checkpoint", None)
    return job


def launch(build, job, workers, ps):
    """Runs `job` on a local cluster: its summary, and the peak RSS of each role (bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        job_path, summary_path = os.path.join(tmp, "job.json"), os.path.join(tmp, "summary.json")
        with open(job_path, "w") as f:
            json.dump(job, f)
        launcher = subprocess.Popen(
            [os.path.join(build, "bin", "stratum-launch"), "--job=" + job_path,
             "--workers=%d" % workers, "--ps=%d" % ps, "--summary-json=" + summary_path],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        stop, peaks = threading.Event(), {}
        sampler = threading.Thread(target=peak_rss_by_role, args=(launcher.pid, stop, peaks))
        sampler.start()
        output = launcher.communicate(timeout=1800)[0]
        stop.set()
        sampler.join()
        if launcher.returncode != 0:
            raise SystemExit("ctr_bench: stratum-launch exited %d:\n%s" %
                             (launcher.returncode, output[-3000:]))
        with open(summary_path) as f:
            summary = json.load(f)
    rss = {}
    for (role, _), peak in peaks.items():
        rss[role] = max(rss.get(role, 0), peak)
    return summary, rss


def run(build, data, workers, ps, rows, best_auc):
    summary, rss = launch(build, ctr_job(data, rows), workers, ps)
    return {"benchmark": "ctr", "workers": workers, "ps": ps, "table_rows": rows,
            "table_mib": rows * 32 * 4 / MIB,
            "examples_per_sec": summary["examples_per_sec"], "test_auc": summary["test_auc"],
            "best_test_auc": best_auc,
            "peak_rss_mib": {role: round(peak / MIB, 1) for role, peak in sorted(rss.items())}}


def run_checkpoint(build, data, ps, rows):
    """One epoch saved to a checkpoint, then a run that resumes from it, trains one more
    epoch and saves again: each ps task's peak RSS beside the state it holds (its shards and
    Adagrad's accumulators)."""
    job = ctr_job(data, rows)
    with tempfile.TemporaryDirectory() as folder:
        job["checkpoint"] = {"dir": os.path.join(folder, "ckpt"), "max_to_keep": 1}
        _, saved = launch(build, job, 1, ps)
        job["fit"]["epochs"] = 2
        resumed_summary, resumed = launch(build, job, 1, ps)
    state = rows * 32 * 4 * 2 / ps / MIB
    return {"benchmark": "ctr_checkpoint", "ps": ps, "table_rows": rows,
            "ps_state_mib": round(state, 1),
            "ps_peak_rss_mib_train_and_save": round(saved["ps"] / MIB, 1),
            "ps_peak_rss_mib_resume_train_and_save": round(resumed["ps"] / MIB, 1),
            "resumed_test_auc": resumed_summary["test_auc"]}


def run_mwms(build, data, rows):
    """MultiWorkerMirrored, 2 workers: the exchange's bytes per step from worker:0's log."""
    job = ctr_job(data, rows)
    job["strategy"] = {"type": "multi_worker_mirrored"}
    with tempfile.TemporaryDirectory() as tmp:
        job_path, logs = os.path.join(tmp, "job.json"), os.path.join(tmp, "logs")
        with open(job_path, "w") as f:
            json.dump(job, f)
        subprocess.run([os.path.join(build, "bin", "stratum-launch"), "--job=" + job_path,
                        "--workers=2", "--log_dir=" + logs], check=True, capture_output=True,
                       timeout=1800)
        with open(os.path.join(logs, "worker-0.log")) as f:
            log = f.read()
    found = re.search(r"exchange all-reduced (\d+) bytes per step .* would move (\d+) "
                      r"\(.*\), over (\d+) steps", log)
    if found is None:
        raise SystemExit("ctr_bench: worker:0's log has no line on the exchange:\n" + log[-3000:])
    sparse, dense, steps = (int(g) for g in found.groups())
    return {"benchmark": "ctr_mwms_exchange", "workers": 2, "table_rows": rows,
            "sparse_bytes_per_step": sparse, "dense_bytes_per_step": dense,
            "ratio": sparse / dense, "steps": steps}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--data", default="/tmp/stratum_ctr")
    parser.add_argument("--rows", type=int, default=1 << 23)
    parser.add_argument("--train", type=int, default=1000000,
                        help="training examples: one epoch of a million takes 10-15 s, long "
                             "enough that start-up does not weigh on examples/s")
    parser.add_argument("--test", type=int, default=50000)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--ps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of each worker count, taking turns; the median run counts "
                             "(a shared machine's speed drifts from run to run)")
    parser.add_argument("--mwms_rows", type=int, default=1 << 20,
                        help="the table of the MultiWorkerMirrored run (0 skips it)")
    parser.add_argument("--checkpoint", action="store_true",
                        help="also save and resume the table, with each ps task's peak RSS")
    args = parser.parse_args()
    best = write_data(args.build, args.data, args.rows, args.train, args.test)
    runs = {}
    counts = [int(w) for w in args.workers.split(",") if w]
    for _ in range(max(args.rounds, 1)):
        for workers in counts:
            result = run(args.build, args.data, workers, args.ps, args.rows, best)
            runs.setdefault(workers, []).append(result)
            print(json.dumps(result), flush=True)
    # Each worker count's median run (by examples/s); peak RSS is the highest of its runs.
    results = {}
    for workers, done in runs.items():
        median = dict(sorted(done, key=lambda r: r["examples_per_sec"])[len(done) // 2])
        median["peak_rss_mib"] = {role: max(r["peak_rss_mib"].get(role, 0) for r in done)
                                  for role in median["peak_rss_mib"]}
        results[workers] = median
    if args.checkpoint:
        print(json.dumps(run_checkpoint(args.build, args.data, args.ps, args.rows)), flush=True)
    summary = {"benchmark": "ctr_goals"}
    if results:
        worker_rss = max(r["peak_rss_mib"].get("worker", 0) for r in results.values())
        summary.update({"worker_peak_rss_mib": worker_rss,
                        "worker_rss_goal": "a worker's peak RSS under 200 MiB while training "
                                           "the 1 GiB table", "worker_rss_met": worker_rss < 200})
    if 1 in results and 2 in results:
        scaling = results[2]["examples_per_sec"] / results[1]["examples_per_sec"]
        summary.update({"examples_per_sec_1_worker": results[1]["examples_per_sec"],
                        "examples_per_sec_2_workers": results[2]["examples_per_sec"],
                        "rounds": max(args.rounds, 1), "scaling_2_over_1": scaling,
                        "scaling_goal": "2 workers >= 1.6x the examples/s of 1 (2 ps)",
                        "scaling_met": scaling >= 1.6, "cores": os.cpu_count()})
    if args.mwms_rows > 0:
        mwms_data = args.data + "-mwms"
        write_data(args.build, mwms_data, args.mwms_rows, args.train, args.test)
        exchange = run_mwms(args.build, mwms_data, args.mwms_rows)
        print(json.dumps(exchange), flush=True)
        summary.update({"exchange_ratio": exchange["ratio"],
                        "exchange_goal": "MultiWorkerMirrored's sparse exchange under a fifth "
                                         "of the bytes of a dense all-reduce of the table",
                        "exchange_met": exchange["ratio"] < 0.2})
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
