#!/usr/bin/env bash
# Builds, here, what bench/gpu_check.sh runs on a GPU machine that has no Rust toolchain, and
# copies it into one folder (default gpu_bundle/, git-ignored), stripped, under 64 MiB:
#   resnet, mnist                  the release examples (target/release/examples)
#   cuda                           the CUDA test binary (its modules emu_training, emu_kernels,
#                                  emu_ops, emu_tf32 and emu_half compare against the CPU backend;
#                                  target/release/deps/cuda-<hash>, found through cargo's own
#                                  report of the executables it built)
#   gpu_check.sh, pytorch_train.py the check and PyTorch's side of it
#   gpu_profile.sh                 per-kernel Nsight Compute tables per precision
#   BUILD                          the commit and toolchain they were built from
# Not run there (gpu_check.sh picks its modules): no_gpu (asserts that there is NO GPU), compile
# and perf_model (they compare against snapshots of the source tree and need no GPU),
# emu_faults (faults with PTX lines are an emulator feature).
#
#   bash bench/gpu_pack.sh [DIR] [--base REV]
# then copy DIR to the GPU machine and run `bash DIR/gpu_check.sh` there. With --base, the
# resnet example of commit REV is built too (in a temporary git worktree, its own target
# folder target/gpu_pack_base kept for the next time) into DIR/old/ (with its BUILD), so that
# one device call can A/B the two builds: `bash DIR/gpu_profile.sh --out $OUT --bins "DIR
# DIR/old"` alternates them and tables every launch of the first.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/gpu_bundle
base=
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base=${2:?--base needs a commit}; shift 2 ;;
    -*) echo "gpu_pack.sh: unknown argument $1" >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done
tests=(cuda)
limit=$((64 * 1024 * 1024))

cd "$root"
cargo build --release --example resnet --example mnist
test_args=()
for t in "${tests[@]}"; do test_args+=(--test "$t"); done
# cargo prints one JSON message per artifact; keep the test executables' paths by target name.
cargo test --release --no-run --message-format=json "${test_args[@]}" >"$root/target/gpu_pack.json"

mkdir -p "$out"
cp target/release/examples/resnet target/release/examples/mnist "$out/"
python3 - "$root/target/gpu_pack.json" "$out" "${tests[@]}" <<'PY'
import json, shutil, sys
messages, out, wanted = sys.argv[1], sys.argv[2], set(sys.argv[3:])
found = {}
for line in open(messages):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and m["target"]["name"] in wanted and "test" in m["target"]["kind"]:
        found[m["target"]["name"]] = m["executable"]
missing = wanted - set(found)
if missing:
    sys.exit(f"gpu_pack.sh: cargo built no executable for {', '.join(sorted(missing))}")
for name, exe in found.items():
    shutil.copy(exe, f"{out}/{name}")
PY
cp bench/gpu_check.sh bench/gpu_profile.sh bench/pytorch_train.py "$out/"
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) by $(rustc --version)"
} >"$out/BUILD"
if command -v strip >/dev/null; then
  strip "$out/resnet" "$out/mnist" "${tests[@]/#/$out/}"
fi
if [ -n "$base" ]; then
  rev=$(git rev-parse --verify "$base^{commit}")
  tree=$(mktemp -d "${TMPDIR:-/tmp}/gpu_pack_base.XXXXXX")
  git worktree add --detach -q "$tree" "$rev"
  # The worktree goes whatever happens to the build.
  trap 'git -C "$root" worktree remove --force "$tree" 2>/dev/null || true' EXIT
  (cd "$tree" && cargo build --release --example resnet --target-dir "$root/target/gpu_pack_base")
  mkdir -p "$out/old"
  cp "$root/target/gpu_pack_base/release/examples/resnet" "$out/old/"
  if command -v strip >/dev/null; then strip "$out/old/resnet"; fi
  {
    echo "commit $rev"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) by $(rustc --version)"
  } >"$out/old/BUILD"
fi
size=$(du -sb "$out" | cut -f1)
echo "gpu_pack.sh: $out holds $((size / 1024 / 1024)) MiB:"
ls -lR "$out"
if [ "$size" -ge "$limit" ]; then
  echo "gpu_pack.sh: $out is over 64 MiB" >&2
  exit 1
fi
