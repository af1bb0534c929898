#!/usr/bin/env python3
"""towerpack against PyTorch eager, side by side in one run, with ratios.

Builds `cargo bench --bench train_step` once, then for each of --repeats rounds runs, model by
model, towerpack's benchmark binary and `bench/pytorch_train.py` back to back (alternating
which goes first), both with the same thread count. Prints every round's figures, then per
model the median ratio towerpack/PyTorch (examples per second; higher is better for
towerpack) with its spread (min..max over rounds). The machine is shared: only these
same-run ratios mean anything, and the spread says how much to trust them.

    python3 bench/compare.py [--repeats 5] [--threads 2] [--rounds 3] [--secs 1.0]
        [--models resnet20,mlp,linear] [--cpu-time]

On a busy machine, --cpu-time compares CPU seconds per thread (both runtimes' idle threads
sleeping) instead of wall time, which mostly measures how each copes with being preempted.

Needs `pip install torch`; without it, only towerpack's figures are printed. Also reports
the ResNet-50 lowering time (target: under 200 ms).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# towerpack model -> PyTorch variants it is compared with.
PAIRS = {
    "resnet20": ["resnet20", "resnet20-nchw"],
    "mlp": ["mlp"],
    "linear": ["linear"],
}


def bench_binary():
    """Builds the benchmark and returns its executable (from cargo's JSON messages)."""
    out = subprocess.run(
        ["cargo", "bench", "--bench", "train_step", "--no-run", "--message-format=json"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") \
                and msg["target"]["name"] == "train_step":
            return msg["executable"]
    raise SystemExit("compare.py: cargo did not report the train_step bench executable")


def parse(text):
    """{name: (seconds per step, examples per second)} from --machine lines."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] in ("train", "lower"):
            out[parts[1]] = (float(parts[2]), float(parts[3]))
    return out


def run(cmd):
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"compare.py: {' '.join(cmd)} failed ({r.returncode})")
    return parse(r.stdout)


def have_torch():
    return subprocess.run([sys.executable, "-c", "import torch"],
                          capture_output=True).returncode == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds per measurement")
    ap.add_argument("--secs", type=float, default=1.0, help="seconds per timing round")
    ap.add_argument("--models", default="resnet20,mlp,linear")
    ap.add_argument("--cpu-time", action="store_true",
                    help="compare CPU seconds per thread instead of wall time (busy machines)")
    a = ap.parse_args()
    models = [m for m in a.models.split(",") if m]
    exe = bench_binary()
    torch_ok = have_torch()
    if not torch_ok:
        print("PyTorch is not installed (pip install torch): towerpack figures only")
    common = ["--threads", str(a.threads), "--rounds", str(a.rounds), "--secs", str(a.secs)]
    if a.cpu_time:
        common.append("--cpu-time")
    ours = {m: [] for m in models}
    theirs = {v: [] for m in models for v in PAIRS[m]}
    lowering = []
    for r in range(a.repeats):
        for i, m in enumerate(models):
            tp_cmd = [exe, m, "--machine"] + common
            pt_cmd = [sys.executable, os.path.join(HERE, "pytorch_train.py"), *PAIRS[m],
                      "--machine"] + common
            first_ours = (r + i) % 2 == 0
            order = [tp_cmd, pt_cmd] if first_ours else [pt_cmd, tp_cmd]
            results = {}
            for cmd in order:
                if cmd is pt_cmd and not torch_ok:
                    continue
                results.update({("pt" if cmd is pt_cmd else "tp", k): v
                                for k, v in run(cmd).items()})
            ours[m].append(results[("tp", m)][1])
            line = f"round {r + 1} {m:<9} towerpack {results[('tp', m)][1]:>10.1f}/s"
            for v in PAIRS[m] if torch_ok else []:
                theirs[v].append(results[("pt", v)][1])
                line += f"  torch[{v}] {results[('pt', v)][1]:>10.1f}/s"
            print(line, flush=True)
        lowering.append(run([exe, "lower", "--machine", "--rounds", "3"])["resnet50"])
        print(f"round {r + 1} lowering ResNet-50 training step {lowering[-1][0] * 1e3:.1f} ms "
              f"({lowering[-1][1] * 1e3:.1f} ms CPU)", flush=True)

    print("\nmodel       towerpack ex/s   PyTorch ex/s (variant)       ratio median [min..max]")
    for m in models:
        tp = statistics.median(ours[m])
        if not torch_ok:
            print(f"{m:<10} {tp:>14.1f}")
            continue
        for v in PAIRS[m]:
            ratios = [o / t for o, t in zip(ours[m], theirs[v])]
            print(f"{m:<10} {tp:>14.1f} {statistics.median(theirs[v]):>14.1f} ({v:<13}) "
                  f"{statistics.median(ratios):6.2f}x [{min(ratios):.2f}..{max(ratios):.2f}]")
    if "linear" in models:
        us = 8 / statistics.median(ours["linear"]) * 1e6
        print(f"linear     towerpack {us:.1f} µs/step")
        if torch_ok:
            print(f"linear     PyTorch   {8 / statistics.median(theirs['linear']) * 1e6:.1f} µs/step")
    wall = [w for w, _ in lowering]
    cpu = statistics.median(c for _, c in lowering)
    print(f"lowering   ResNet-50 training step: median {statistics.median(wall) * 1e3:.1f} ms "
          f"[{min(wall) * 1e3:.1f}..{max(wall) * 1e3:.1f}], {cpu * 1e3:.1f} ms CPU "
          f"(target < 200 ms)")


if __name__ == "__main__":
    main()
