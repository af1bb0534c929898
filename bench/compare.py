#!/usr/bin/env python3
"""towerpack against PyTorch eager, side by side in one run, with ratios.

Builds `cargo bench --bench train_step` once, then for each of --repeats rounds runs, model by
model, towerpack's benchmark binary and `bench/pytorch_train.py` back to back (alternating
which goes first), both with the same thread count. Prints every round's figures, then per
model the median ratio towerpack/PyTorch (examples per second; higher is better for
towerpack) with its spread (min..max over rounds). The machine is shared: only these
same-run ratios mean anything, and the spread says how much to trust them.

    python3 bench/compare.py [--repeats 5] [--threads 2] [--rounds 3] [--secs 1.0]
        [--models resnet20,mlp,linear] [--cpu-time] [--simd scalar|avx2|avx512]

It prints the CPU, the SIMD level its flags allow (what towerpack detects) and the level in
force. --simd LEVEL (or TOWERPACK_SIMD in the environment) caps towerpack's kernels at LEVEL and
caps PyTorch the same way (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS), so
that `--simd avx2` on an AVX-512 machine approximates an AVX2 machine with the same cores,
caches and clocks — an approximation, not a measurement on an AVX2-only CPU.

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


def run(cmd, env=None):
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"compare.py: {' '.join(cmd)} failed ({r.returncode})")
    return parse(r.stdout)


def have_torch():
    return subprocess.run([sys.executable, "-c", "import torch"],
                          capture_output=True).returncode == 0


LEVELS = ("scalar", "avx2", "avx512")

# PyTorch's own switches for each towerpack level (ATen's dispatch, oneDNN, MKL).
TORCH_CAPS = {
    "scalar": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
               "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512": {},
}


def cpu_info():
    """(model name, the SIMD level the CPU flags allow, as towerpack's probe decides it)."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown CPU":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    avx2 = {"avx2", "fma", "bmi1", "bmi2", "abm", "popcnt"} <= flags
    avx512 = avx2 and {"avx512f", "avx512vl", "avx512bw", "avx512dq"} <= flags
    return model, "avx512" if avx512 else "avx2" if avx2 else "scalar"


def torch_capability(env):
    """What PyTorch reports it dispatches to under `env`."""
    r = subprocess.run([sys.executable, "-c",
                        "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                       capture_output=True, text=True, env=env)
    return r.stdout.strip() or "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds per measurement")
    ap.add_argument("--secs", type=float, default=1.0, help="seconds per timing round")
    ap.add_argument("--models", default="resnet20,mlp,linear")
    ap.add_argument("--cpu-time", action="store_true",
                    help="compare CPU seconds per thread instead of wall time (busy machines)")
    ap.add_argument("--simd", choices=LEVELS, default=os.environ.get("TOWERPACK_SIMD") or None,
                    help="cap towerpack (TOWERPACK_SIMD) and PyTorch at this SIMD level")
    a = ap.parse_args()
    models = [m for m in a.models.split(",") if m]
    exe = bench_binary()
    model, detected = cpu_info()
    forced = a.simd
    env = dict(os.environ)
    env.pop("TOWERPACK_SIMD", None)
    if forced:
        env["TOWERPACK_SIMD"] = forced
        env.update(TORCH_CAPS[forced])
    in_force = min(forced or detected, detected, key=LEVELS.index)
    print(f"CPU: {model}; SIMD detected: {detected}; in force: {in_force}"
          + (f" (forced: TOWERPACK_SIMD={forced}; PyTorch: "
             + (", ".join(f"{k}={v}" for k, v in TORCH_CAPS[forced].items()) or "uncapped")
             + ")" if forced else " (native)"))
    torch_ok = have_torch()
    if not torch_ok:
        print("PyTorch is not installed (pip install torch): towerpack figures only")
    else:
        print(f"PyTorch CPU capability in force: {torch_capability(env)}")
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
                                for k, v in run(cmd, env).items()})
            ours[m].append(results[("tp", m)][1])
            line = f"round {r + 1} {m:<9} towerpack {results[('tp', m)][1]:>10.1f}/s"
            for v in PAIRS[m] if torch_ok else []:
                theirs[v].append(results[("pt", v)][1])
                line += f"  torch[{v}] {results[('pt', v)][1]:>10.1f}/s"
            print(line, flush=True)
        lowering.append(run([exe, "lower", "--machine", "--rounds", "3"], env)["resnet50"])
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
