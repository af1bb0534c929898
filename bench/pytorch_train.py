#!/usr/bin/env python3
"""PyTorch eager (CPU, fp32) training steps of the models `benches/train_step.rs` times.

The same models as towerpack's benchmark, built to match its graphs:

* `resnet20`: tensorpack's CIFAR pre-activation ResNet-20 (conv0 + BNReLU, 3x3 residual blocks
  with BNReLU pre-activation, avg-pool + zero-channel-pad shortcuts, bnlast BNReLU, global
  average pooling, linear 10), batch 128 of 32x32x3, in channels_last (`resnet20`) and NCHW
  (`resnet20-nchw`); L2 2e-4 on the weights.
* `mlp`: 784-512-512-10 with ReLU, batch 256; L2 1e-5 on the weights.
* `linear`: Linear(10, 10), batch 8 (framework overhead).

Each step is `zero_grad; loss = cross_entropy(model(x), y) (+ L2); backward; SGD momentum 0.9
step`, the loss read back as a Python float (as towerpack's step fetches its cost). Prints one
`train NAME SECONDS_PER_STEP EXAMPLES_PER_SEC` line per model with --machine.

    python3 bench/pytorch_train.py [resnet20 resnet20-nchw mlp linear] [--threads 2]
        [--rounds 5] [--secs 1.0] [--machine] [--cpu-time]
"""

import argparse
import os
import sys
import time

if "--cpu-time" in sys.argv:
    # Idle OpenMP threads must sleep, not spin, or their spinning counts as PyTorch's CPU time.
    # (Read when the OpenMP runtime starts, so before importing torch.)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - reported to the caller
    print("pytorch_train.py: torch is not installed (pip install torch)", file=sys.stderr)
    sys.exit(2)

MODELS = ["resnet20", "resnet20-nchw", "mlp", "linear"]


class Residual(nn.Module):
    """tensorpack's pre-activation block (`residual` in cifar10-resnet.py)."""

    def __init__(self, cin, increase_dim, first):
        super().__init__()
        cout, stride = (cin * 2, 2) if increase_dim else (cin, 1)
        self.first, self.increase_dim, self.cin = first, increase_dim, cin
        self.bn0 = None if first else nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)

    def forward(self, x):
        b1 = x if self.first else F.relu(self.bn0(x))
        c1 = F.relu(self.bn1(self.conv1(b1)))
        c2 = self.conv2(c1)
        if self.increase_dim:
            short = F.avg_pool2d(x, 2)
            p = self.cin // 2
            short = F.pad(short, (0, 0, 0, 0, p, p))  # zero channels (NCHW dim 1)
        else:
            short = x
        return c2 + short


class ResNet20(nn.Module):
    def __init__(self, n=3, classes=10):
        super().__init__()
        self.conv0 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn0 = nn.BatchNorm2d(16)
        blocks, c = [], 16
        for stage in range(1, 4):
            for k in range(n):
                inc = stage > 1 and k == 0
                blocks.append(Residual(c, inc, stage == 1 and k == 0))
                if inc:
                    c *= 2
        self.blocks = nn.Sequential(*blocks)
        self.bnlast = nn.BatchNorm2d(c)
        self.linear = nn.Linear(c, classes)

    def forward(self, x):
        x = F.relu(self.bn0(self.conv0(x / 128.0)))
        x = self.blocks(x)
        x = F.relu(self.bnlast(x))
        return self.linear(x.mean(dim=(2, 3)))


def mlp():
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 512),
        nn.ReLU(),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Linear(512, 10),
    )


def setup(name):
    """(model, batches, batch size, weight decay, memory format) of a benchmark."""
    g = torch.Generator().manual_seed(0)
    if name.startswith("resnet20"):
        fmt = torch.contiguous_format if name.endswith("nchw") else torch.channels_last
        model, batch, wd = ResNet20().to(memory_format=fmt), 128, 2e-4
        xs = [(torch.rand(batch, 3, 32, 32, generator=g) * 256 - 128).to(memory_format=fmt)
              for _ in range(4)]
    elif name == "mlp":
        model, batch, wd = mlp(), 256, 1e-5
        xs = [torch.rand(batch, 28, 28, generator=g) * 2 - 1 for _ in range(4)]
    elif name == "linear":
        model, batch, wd = nn.Linear(10, 10), 8, 0.0
        xs = [torch.rand(batch, 10, generator=g) * 2 - 1 for _ in range(4)]
    else:
        raise SystemExit(f"unknown model {name} ({', '.join(MODELS)})")
    ys = [torch.randint(0, 10, (batch,), generator=g) for _ in range(4)]
    return model, list(zip(xs, ys)), batch, wd


def make_step(model, wd):
    # tensorpack's L2 is on the weights (".*/W"), not biases or BN parameters.
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.dim() > 1)]
    groups = [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]
    opt = torch.optim.SGD(groups, lr=0.01, momentum=0.9)
    model.train()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def time_model(name, rounds, secs, threads, cpu_time):
    """(median, best) seconds per step over `rounds` rounds of at least `secs` seconds (with
    `cpu_time`, process CPU seconds divided by the thread count)."""
    model, data, batch, wd = setup(name)
    step = make_step(model, wd)
    for i in range(2):
        step(*data[i % len(data)])
    times = []
    for _ in range(rounds):
        n, start, cpu_start = 0, time.perf_counter(), time.process_time()
        while n == 0 or time.perf_counter() - start < secs:
            step(*data[n % len(data)])
            n += 1
        if cpu_time:
            times.append((time.process_time() - cpu_start) / threads / n)
        else:
            times.append((time.perf_counter() - start) / n)
    times.sort()
    return times[len(times) // 2], times[0], batch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=MODELS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--secs", type=float, default=1.0)
    ap.add_argument("--machine", action="store_true")
    ap.add_argument("--cpu-time", action="store_true",
                    help="CPU seconds per thread instead of wall time (busy machines)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    for name in a.models:
        median, best, batch = time_model(name, a.rounds, a.secs, a.threads, a.cpu_time)
        if a.machine:
            print(f"train {name} {median:.9f} {batch / median:.3f}", flush=True)
        else:
            print(f"{name:<14} batch {batch:<4} {median * 1e6:>10.1f} us/step "
                  f"{1 / median:>9.1f} steps/s {batch / median:>9.1f} examples/s "
                  f"(best {best * 1e6:.1f} us)", flush=True)


if __name__ == "__main__":
    main()
