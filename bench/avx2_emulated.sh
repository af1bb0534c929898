#!/usr/bin/env bash
# An AVX2-only CPU, emulated: trains a few steps under qemu-user with a CPU model that has AVX2
# and FMA but no AVX-512 (AMD EPYC Rome) and checks that the weights are bitwise those the same
# run computes natively with TOWERPACK_SIMD=avx2 — the override the test suite uses to run the
# AVX2 paths on an AVX-512 machine — and differ from the detected level's (so the comparison
# can fail). What it shows: the override reproduces what an AVX2-only machine computes (its
# CPUID, its SIMD probe, no AMX), so tests passing under the override pass there too. What it
# cannot show: speed (qemu emulates every instruction; a step takes minutes).
#
# Needs qemu-user (Debian: apt-get install qemu-user) and the release examples
# (cargo build --release --example mnist --example resnet). Takes about 25 minutes on 2 cores
# (measured 2026-11-28: 22 min, qemu 7.2).
#
#   bash bench/avx2_emulated.sh [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/avx2-emulated
if [[ "${1:-}" == "--out" ]]; then out=$2; fi
cpu=EPYC-Rome
command -v qemu-x86_64 >/dev/null || { echo "no qemu-x86_64: apt-get install qemu-user" >&2; exit 2; }
for e in mnist resnet; do
  [[ -x target/release/examples/$e ]] || { echo "build first: cargo build --release --example $e" >&2; exit 2; }
done
rm -rf "$out"
mkdir -p "$out"

# run NAME EXAMPLE ARGS...: under qemu (emu), forced to avx2, and at the detected level.
run() {
  local name=$1 example=target/release/examples/$2
  shift 2
  echo "$name: $(date -u +%T) under qemu -cpu $cpu"
  qemu-x86_64 -cpu "$cpu" "$example" "$@" --fresh --logdir "$out/$name-emu" >"$out/$name-emu.log" 2>&1
  TOWERPACK_SIMD=avx2 "$example" "$@" --fresh --logdir "$out/$name-avx2" >"$out/$name-avx2.log" 2>&1
  "$example" "$@" --fresh --logdir "$out/$name-native" >"$out/$name-native.log" 2>&1
}
common=(--max-epoch 1 --threads 2)
run mnist-convnet mnist --model convnet "${common[@]}" --steps-per-epoch 20 --val-images 200 --seed 3
run resnet20-fp32 resnet "${common[@]}" --steps-per-epoch 4 --batch 16 --val-images 100 --seed 5 --precision fp32
run resnet20-bf16 resnet "${common[@]}" --steps-per-epoch 4 --batch 16 --val-images 100 --seed 5 --precision bf16

python3 - "$out" <<'EOF'
import glob, json, os, struct, sys

out = sys.argv[1]

def data(path):
    """The tensor bytes of a safetensors file (the header may carry run metadata)."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return b[8 + n:]

def last_checkpoint(logdir):
    files = glob.glob(os.path.join(logdir, "model-*.safetensors"))
    return max(files, key=lambda f: int(f.rsplit("-", 1)[1].split(".")[0]))

bad = 0
for name in ("mnist-convnet", "resnet20-fp32", "resnet20-bf16"):
    emu, avx2, native = (data(last_checkpoint(f"{out}/{name}-{k}")) for k in ("emu", "avx2", "native"))
    same = emu == avx2
    bad += not same
    print(f"{name}: AVX2-only CPU (qemu) == TOWERPACK_SIMD=avx2: {same}; "
          f"== detected level: {emu == native} ({len(emu)} bytes of weights)")
sys.exit(1 if bad else 0)
EOF
