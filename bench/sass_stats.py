#!/usr/bin/env python3
"""Static SASS counts of CUDA kernels, without a GPU: what ptxas makes of towerpack's PTX.

    cargo run --release --example resnet -- --batch 128 --precision tf32 --kernel-sources new/
    python3 bench/sass_stats.py new/ [base/]

Each `NNN_<name>.ptx` of the folder (written by `--kernel-sources`) is assembled by ptxas for
sm_90 and disassembled by nvdisasm; per kernel it prints ptxas's registers and spill bytes, and
from the SASS: instructions, global loads (LDG), global stores (STG), branches (BRA) and
*waits* — the points where, in program order, an instruction reads a register that an LDG
before it has not filled yet (every outstanding LDG counts as landed there). Waits are a static
proxy for how often a warp stops for memory in straight-line code: loads issued together wait
once. With a second folder (the same step from another commit), each column is `base -> new`
and the totals are compared. The counts are of code, not of a run: a loop body counts once.

Needs ptxas (`TOWERPACK_PTXAS`, `ptxas` on the PATH, or the `nvidia-cuda-nvcc-cu12` wheel that
`cargo xtask test` installs into target/pydeps) and nvdisasm (`TOWERPACK_NVDISASM`, the PATH,
or `pip install nvidia-cuda-nvdisasm`).
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def find_tool(name, env, wheel_dirs):
    if os.environ.get(env):
        return os.environ[env]
    on_path = shutil.which(name)
    if on_path:
        return on_path
    roots = [Path(p) for p in sys.path if p] + [Path("target/pydeps")]
    for root in roots:
        for sub in wheel_dirs:
            candidate = root / sub / "bin" / name
            if candidate.is_file():
                return str(candidate)
    sys.exit(f"{name} not found: set {env}, put it on the PATH, or install its wheel")


PTXAS = None
NVDISASM = None
INSTRUCTION = re.compile(r"\s*/\*[0-9a-f]+\*/\s*(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)\s*(.*?)\s*;")
REGISTER = re.compile(r"\bR(\d+)(\.64)?\b")


def registers_of(operands):
    regs = set()
    for text in operands:
        for r, wide in REGISTER.findall(text):
            regs.add(int(r))
            if wide:
                regs.add(int(r) + 1)
    return regs


def sass_counts(sass):
    """instructions, LDG, STG, BRA, waits of one disassembly."""
    counts = dict(insts=0, ldg=0, stg=0, bra=0, waits=0)
    outstanding = set()
    for line in sass.splitlines():
        m = INSTRUCTION.match(line)
        if not m:
            continue
        op, args = m.group(1), m.group(2)
        counts["insts"] += 1
        parts = [a.strip() for a in args.split(",")] if args else []
        # Stores, branches, barriers and async copies write no register; the rest write their
        # first operand.
        writes_none = op.startswith(("ST", "RED", "BAR", "BRA", "EXIT", "LDGSTS", "DEPBAR"))
        sources, dests = (parts, []) if writes_none else (parts[1:], parts[:1])
        if outstanding & registers_of(sources):
            counts["waits"] += 1
            outstanding.clear()
        if op.startswith("LDG"):
            counts["ldg"] += 1
            width = 4 if ".128" in op else 2 if ".64" in op else 1
            for d in dests:
                r = REGISTER.search(d)
                if r:
                    outstanding.update(range(int(r.group(1)), int(r.group(1)) + width))
        elif op.startswith("STG"):
            counts["stg"] += 1
        elif op.startswith("BRA"):
            counts["bra"] += 1
    return counts


def kernel_stats(ptx):
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        report = subprocess.run(
            [PTXAS, "-arch=sm_90", "-v", str(ptx), "-o", str(cubin)],
            capture_output=True,
            text=True,
        )
        if report.returncode != 0:
            sys.exit(f"ptxas failed on {ptx}:\n{report.stderr}")
        text = report.stdout + report.stderr
        regs = re.search(r"Used (\d+) registers", text)
        spill = re.search(r"(\d+) bytes spill stores", text)
        sass = subprocess.run([NVDISASM, "-c", str(cubin)], capture_output=True, text=True)
        if sass.returncode != 0:
            sys.exit(f"nvdisasm failed on {ptx}:\n{sass.stderr}")
    stats = sass_counts(sass.stdout)
    stats["regs"] = int(regs.group(1)) if regs else 0
    stats["spill"] = int(spill.group(1)) if spill else 0
    return stats


COLUMNS = ["regs", "spill", "insts", "ldg", "stg", "bra", "waits"]


def folder(path):
    return {p.name: p for p in sorted(Path(path).glob("*.ptx"))}


def main():
    global PTXAS, NVDISASM
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    PTXAS = find_tool("ptxas", "TOWERPACK_PTXAS", ["nvidia/cuda_nvcc", "nvidia/cu13"])
    NVDISASM = find_tool(
        "nvdisasm", "TOWERPACK_NVDISASM", ["nvidia/cu13", "nvidia/cuda_nvdisasm"]
    )
    new = folder(sys.argv[1])
    base = folder(sys.argv[2]) if len(sys.argv) == 3 else {}
    if not new:
        sys.exit(f"no .ptx files in {sys.argv[1]} (write them with --kernel-sources)")
    print("kernel | " + " | ".join(COLUMNS))
    totals = {c: [0, 0] for c in COLUMNS}
    for name, ptx in new.items():
        s = kernel_stats(ptx)
        b = kernel_stats(base[name]) if name in base else None
        cells = []
        for c in COLUMNS:
            if b is not None:
                totals[c][0] += b[c]
                totals[c][1] += s[c]
                cells.append(f"{b[c]} -> {s[c]}" if b[c] != s[c] else str(s[c]))
            else:
                if not base:
                    totals[c][1] += s[c]
                cells.append(str(s[c]))
        print(f"{name[:-4]} | " + " | ".join(cells))
    missing = sorted(set(base) - set(new))
    if missing:
        print(f"only in the base folder: {', '.join(missing)}")
    if base:
        print("total (kernels in both) | " + " | ".join(
            f"{totals[c][0]} -> {totals[c][1]}" for c in COLUMNS[2:]
        ) + "  (" + ", ".join(COLUMNS[2:]) + ")")
    else:
        print("total | " + " | ".join(str(totals[c][1]) for c in COLUMNS[2:]))


if __name__ == "__main__":
    main()
