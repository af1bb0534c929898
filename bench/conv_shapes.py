#!/usr/bin/env python3
"""Per-convolution timings of towerpack's CPU kernels next to PyTorch, in one run.

The convolutions of a CIFAR ResNet-20 training step at batch 128 (forward, backward-input,
backward-filter), PyTorch on channels_last tensors through `torch.ops.aten.convolution_backward`
(the kernels autograd calls), both with 2 threads. The machine is shared, so the two sides are
measured in alternating rounds and each keeps its best time; only the ratios are meaningful.

    python3 bench/conv_shapes.py [--rounds 3] [--threads 2] [--cpu-time]

On a busy machine, --cpu-time compares CPU seconds per thread instead of wall time (idle OpenMP
threads are made to sleep so that spinning is not counted); wall-clock comparisons there mostly
measure how each runtime copes with being preempted.

Needs `pip install torch` and runs `cargo bench --bench cpu_kernels -- conv --machine`.
"""

import argparse
import os
import subprocess
import sys
import time

if "--cpu-time" in sys.argv:
    # Idle OpenMP threads must sleep, not spin, or their spinning counts as PyTorch's CPU time.
    # (Read when the OpenMP runtime starts, so before importing torch.)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

# (name as printed by the Rust bench, H=W, C, O, kernel, stride, count in one ResNet-20 step)
SHAPES = [
    ("conv0 32x32x3->16", 32, 3, 16, 3, 1, 1),
    ("s1 32x32x16->16", 32, 16, 16, 3, 1, 6),
    ("t1 32x32x16->32 s2", 32, 16, 32, 3, 2, 1),
    ("s2 16x16x32->32", 16, 32, 32, 3, 1, 5),
    ("t2 16x16x32->64 s2", 16, 32, 64, 3, 2, 1),
    ("s3 8x8x64->64", 8, 64, 64, 3, 1, 5),
    ("p1 32x32x16->32 1x1 s2", 32, 16, 32, 1, 2, 0),
    ("p2 16x16x32->64 1x1 s2", 16, 32, 64, 1, 2, 0),
]
PASSES = [("conv-fwd", "fwd"), ("conv-bwdin", "bwd_in"), ("conv-bwdw", "bwd_w")]
BATCH = 128


CPU_TIME = False  # set by --cpu-time


def best_time(f, min_secs=0.1, reps=3):
    """Best seconds per call; with --cpu-time, process CPU seconds divided by the thread count."""
    f()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        cpu_start = time.process_time()
        n = 0
        while n == 0 or time.perf_counter() - start < min_secs:
            f()
            n += 1
        if CPU_TIME:
            secs = (time.process_time() - cpu_start) / torch.get_num_threads()
        else:
            secs = time.perf_counter() - start
        best = min(best, secs / n)
    return best


def torch_round():
    out = {}
    for name, hw, c, o, k, s, _ in SHAPES:
        pad = k // 2
        x = torch.randn(BATCH, c, hw, hw).to(memory_format=torch.channels_last)
        w = torch.randn(o, c, k, k).to(memory_format=torch.channels_last)
        y = torch.nn.functional.conv2d(x, w, stride=s, padding=pad)
        dy = torch.randn_like(y).contiguous(memory_format=torch.channels_last)

        def backward(mask):
            return lambda: torch.ops.aten.convolution_backward(
                dy, x, w, None, [s, s], [pad, pad], [1, 1], False, [0, 0], 1, mask)

        with torch.no_grad():
            out[(name, "conv-fwd")] = best_time(
                lambda: torch.nn.functional.conv2d(x, w, stride=s, padding=pad))
            out[(name, "conv-bwdin")] = best_time(backward([True, False, False]))
            out[(name, "conv-bwdw")] = best_time(backward([False, True, False]))
    return out


def rust_round(threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), BENCH_CPU_TIME=str(int(CPU_TIME)))
    text = subprocess.run(
        ["cargo", "bench", "--quiet", "--bench", "cpu_kernels", "--", "conv", "--machine"],
        check=True, capture_output=True, text=True, env=env).stdout
    out = {}
    for line in text.splitlines():
        kind, rest = line.split(" ", 1)
        name, secs, _gflops = rest.rsplit(" ", 2)
        out[(name, kind)] = float(secs)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cpu-time", action="store_true",
                        help="time by CPU seconds per thread (a busy machine; 1 thread is fairest, "
                             "as spinning idle threads count too)")
    args = parser.parse_args()
    global CPU_TIME
    CPU_TIME = args.cpu_time
    torch.set_num_threads(args.threads)
    clock = "CPU time per thread" if CPU_TIME else "wall time"
    print(f"torch {torch.__version__}, {args.threads} threads, {args.rounds} alternating rounds, "
          f"{clock}")
    best_torch, best_rust = {}, {}
    for _ in range(args.rounds):
        for best, result in ((best_torch, torch_round()), (best_rust, rust_round(args.threads))):
            for key, secs in result.items():
                best[key] = min(best.get(key, float("inf")), secs)

    print(f"{'convolution':<26}{'pass':<8}{'torch ms':>10}{'ours ms':>10}"
          f"{'torch GF/s':>12}{'ours GF/s':>11}{'speedup':>9}")
    step = {"torch": 0.0, "ours": 0.0}
    for name, hw, c, o, k, s, count in SHAPES:
        flops = 2 * BATCH * (hw // s) ** 2 * o * c * k * k
        for kind, label in PASSES:
            t, r = best_torch[(name, kind)], best_rust[(name, kind)]
            print(f"{name:<26}{label:<8}{t * 1e3:>10.3f}{r * 1e3:>10.3f}"
                  f"{flops / t / 1e9:>12.1f}{flops / r / 1e9:>11.1f}{t / r:>8.2f}x")
            if not (name.startswith("conv0") and kind == "conv-bwdin"):
                step["torch"] += count * t
                step["ours"] += count * r
    print(f"ResNet-20 step, convolutions only: torch {step['torch'] * 1e3:.1f} ms "
          f"({BATCH / step['torch']:.0f} img/s), ours {step['ours'] * 1e3:.1f} ms "
          f"({BATCH / step['ours']:.0f} img/s), speedup {step['torch'] / step['ours']:.2f}x")


if __name__ == "__main__":
    main()
