#!/usr/bin/env python3
"""PyTorch eager (fp32, CPU or CUDA) training steps of the models `benches/train_step.rs` times.

The same models as towerpack's benchmark, built to match its graphs:

* `resnet20`: tensorpack's CIFAR pre-activation ResNet-20 (conv0 + BNReLU, 3x3 residual blocks
  with BNReLU pre-activation, avg-pool + zero-channel-pad shortcuts, bnlast BNReLU, global
  average pooling, linear 10), batch 128 of 32x32x3, in channels_last (`resnet20`) and NCHW
  (`resnet20-nchw`); L2 2e-4 on the weights.
* `mlp`: 784-512-512-10 with ReLU, batch 256; L2 1e-5 on the weights.
* `linear`: Linear(10, 10), batch 8 (framework overhead).

Each step is `zero_grad; loss = cross_entropy(model(x), y) (+ L2); backward; SGD momentum 0.9
step`, the loss read back as a Python float (the host waits for every step: towerpack's
`resnet --bench` does not unless `--bench-fetch-every 1`, which fetches its cost every step). Prints one
`train NAME SECONDS_PER_STEP EXAMPLES_PER_SEC` line per model with --machine.

    python3 bench/pytorch_train.py [resnet20 resnet20-nchw mlp linear] [--threads 2]
        [--rounds 5] [--secs 1.0] [--machine] [--cpu-time]
        [--device cpu|cuda] [--tf32 off|on] [--autocast off|bf16|fp16] [--batch B]
        [--warmup 2] [--steps N]

On `--device cuda` the model and every batch live on the GPU, `cudnn.benchmark` is on, TF32
is off unless `--tf32 on` (matmuls and convolutions), and every timed step ends with
`torch.cuda.synchronize()`. `--autocast bf16|fp16` runs the forward pass and the loss under
`torch.autocast` in that type (PyTorch's automatic mixed precision: f32 master weights), fp16
with a `GradScaler` (the step read back, as towerpack's fp16 runs the loss scale); the model
names printed get a `+bf16`/`+fp16` suffix. `--steps N` times exactly N steps per round (after
`--warmup` steps) instead of rounds of at least `--secs` seconds. `--batch` overrides the
model's batch.
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


def setup(name, device="cpu", batch=None):
    """(model, batches, batch size, weight decay) of a benchmark, on `device`."""
    g = torch.Generator().manual_seed(0)
    if name.startswith("resnet20"):
        fmt = torch.contiguous_format if name.endswith("nchw") else torch.channels_last
        batch = batch or 128
        model, wd = ResNet20().to(device=device, memory_format=fmt), 2e-4
        xs = [(torch.rand(batch, 3, 32, 32, generator=g) * 256 - 128)
              .to(device=device, memory_format=fmt) for _ in range(4)]
    elif name == "mlp":
        batch = batch or 256
        model, wd = mlp().to(device), 1e-5
        xs = [(torch.rand(batch, 28, 28, generator=g) * 2 - 1).to(device) for _ in range(4)]
    elif name == "linear":
        batch = batch or 8
        model, wd = nn.Linear(10, 10).to(device), 0.0
        xs = [(torch.rand(batch, 10, generator=g) * 2 - 1).to(device) for _ in range(4)]
    else:
        raise SystemExit(f"unknown model {name} ({', '.join(MODELS)})")
    ys = [torch.randint(0, 10, (batch,), generator=g).to(device) for _ in range(4)]
    return model, list(zip(xs, ys)), batch, wd


def finish(loss, device):
    """The step's loss as a Python float, the device synchronised."""
    value = loss.item()
    if device == "cuda":
        torch.cuda.synchronize()
    return value


def make_step(model, wd, device="cpu", autocast="off"):
    # tensorpack's L2 is on the weights (".*/W"), not biases or BN parameters.
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.dim() > 1)]
    groups = [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]
    opt = torch.optim.SGD(groups, lr=0.01, momentum=0.9)
    model.train()

    if autocast == "off":
        def step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return finish(loss, device)
        return step

    dtype = torch.bfloat16 if autocast == "bf16" else torch.float16
    scaler = torch.amp.GradScaler(device, enabled=autocast == "fp16")

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=dtype):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return finish(loss, device)

    return step


def time_model(name, rounds, secs, threads, cpu_time, device="cpu", batch=None, warmup=2,
               steps=None, autocast="off"):
    """(median, best) seconds per step over `rounds` rounds of at least `secs` seconds, or of
    exactly `steps` steps (with `cpu_time`, process CPU seconds divided by the thread count)."""
    model, data, batch, wd = setup(name, device, batch)
    step = make_step(model, wd, device, autocast)
    for i in range(warmup):
        step(*data[i % len(data)])
    times = []
    for _ in range(rounds):
        n, start, cpu_start = 0, time.perf_counter(), time.process_time()
        while n == 0 or (n < steps if steps else time.perf_counter() - start < secs):
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
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--tf32", choices=["off", "on"], default="off",
                    help="TF32 tensor cores for matmuls and convolutions (cuda only)")
    ap.add_argument("--autocast", choices=["off", "bf16", "fp16"], default="off",
                    help="automatic mixed precision (torch.autocast; fp16 with a GradScaler)")
    ap.add_argument("--batch", type=int, default=None, help="override the model's batch")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=None,
                    help="time exactly this many steps per round (instead of --secs)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.device == "cuda":
        if not torch.cuda.is_available():
            print("pytorch_train.py: --device cuda but torch sees no GPU", file=sys.stderr)
            sys.exit(2)
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = a.tf32 == "on"
        torch.backends.cudnn.allow_tf32 = a.tf32 == "on"
    for name in a.models:
        median, best, batch = time_model(name, a.rounds, a.secs, a.threads, a.cpu_time,
                                         a.device, a.batch, a.warmup, a.steps, a.autocast)
        if a.autocast != "off":
            name = f"{name}+{a.autocast}"
        if a.machine:
            print(f"train {name} {median:.9f} {batch / median:.3f}", flush=True)
        else:
            print(f"{name:<14} batch {batch:<4} {median * 1e6:>10.1f} us/step "
                  f"{1 / median:>9.1f} steps/s {batch / median:>9.1f} examples/s "
                  f"(best {best * 1e6:.1f} us)", flush=True)


if __name__ == "__main__":
    main()
