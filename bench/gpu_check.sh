#!/usr/bin/env bash
# towerpack's CUDA backend on a machine with a GPU, in one run of under 6 minutes, with no Rust
# toolchain and no network: prebuilt binaries beside this script (made by bench/gpu_pack.sh on
# a build machine: `bash bench/gpu_pack.sh`, then copy gpu_bundle/ over), CUDA 12.9+ driver,
# PyTorch with CUDA, and, when present, Nsight Compute's ncu and compute-sanitizer.
#
#   bash gpu_check.sh [--out DIR] [--budget SECONDS] [--bin DIR] [--dry-run]
#
# Runs, each time-boxed, with a deadline for the whole run (default 340 s; dry run 600 s):
#   1. the CUDA test binaries with TOWERPACK_TEST_CUDA=gpu: the same comparisons against the
#      CPU backend as in CI, on the GPU;
#   2. `resnet --device cuda --bench` at batch 64, 128 and 256 (and at 128 in tf32, bf16, fp16);
#      and at 128 in fp32 and bf16 with the cost fetched every step (--bench-fetch-every 1), as
#      PyTorch's step reads its loss;
#   3. PyTorch's ResNet-20 on the same GPU (pytorch_train.py --device cuda): fp32 with TF32 off
#      and on, and bf16 autocast, NCHW and channels_last, batch 128, 10 warm-up and 50 timed
#      steps, 3 rounds;
#   4. the default 16-epoch `resnet --device cuda` run, time-boxed (epochs reached, accuracy,
#      images/s of its last epoch with every callback, against --bench at the same batch);
#   5. compute-sanitizer memcheck, racecheck and synccheck on a short run (first launches);
#   6. `mnist --device cuda` steps per second;
#   7. bitwise determinism: two identical short training runs, their checkpoints' tensors
#      compared byte for byte;
# then prints the ratios (towerpack images/s over PyTorch's best fp32 configuration) and writes
# everything into ONE report file, DIR/gpu_check_report.md (DIR: --out, else $OUT, else
# ./gpu_check_out).
#
# --dry-run proves the plumbing on a machine without a GPU: the emulated device (cuda-emu),
# tiny batches and steps, one quick test per binary, PyTorch on the CPU if installed, the
# sanitizers skipped unless present, mnist for the determinism runs. Same report.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=$here
out=${OUT:-$PWD/gpu_check_out}
budget=
dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
# The whole run's deadline: under 6 minutes on a GPU; the emulated dry run is slower.
if [ -z "$budget" ]; then
  if [ "$dry" = 1 ]; then budget=600; else budget=340; fi
fi
mkdir -p "$out"
report=$out/gpu_check_report.md
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$work"' EXIT
deadline=$((SECONDS + budget))
failures=0

# The CUDA toolkit's libraries and tools, when installed where NVIDIA puts them.
if [ -d /usr/local/cuda/lib64 ]; then
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
if [ -d /usr/local/cuda/bin ]; then
  export PATH=$PATH:/usr/local/cuda/bin
fi
if command -v ptxas >/dev/null; then
  TOWERPACK_PTXAS=$(command -v ptxas)
  export TOWERPACK_PTXAS
fi
export TOWERPACK_CUDA_CACHE=${TOWERPACK_CUDA_CACHE:-$work/ptx-cache}
export RUST_BACKTRACE=1

# Per-step time limits (s): tests, each bench, each PyTorch run, the long run, each
# sanitizer, mnist, each determinism run.
if [ "$dry" = 1 ]; then
  device=cuda-emu
  test_device=emu
  batches=(1)
  bench_steps=1
  torch_device=cpu
  mnist_epochs=1
  limits=(150 90 60 20 40 150 150)
else
  device=cuda
  test_device=gpu
  batches=(64 128 256)
  bench_steps=30
  torch_device=cuda
  mnist_epochs=3
  limits=(150 60 60 75 40 45 60)
fi

say() { printf '%s\n' "$*" | tee -a "$report"; }
section() { say ""; say "## $*"; }

# run NAME SECONDS CMD...: runs CMD with its output in $work/NAME.log, for at most SECONDS and
# never past the deadline; prints one status line. Returns CMD's status (124: timed out, 125:
# skipped for lack of time).
run() {
  local name=$1 limit=$2
  shift 2
  local left=$((deadline - SECONDS - 5))
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -lt 5 ]; then
    say "- \`$name\`: skipped, the run's time budget is spent"
    return 125
  fi
  local start=$SECONDS status
  timeout --kill-after=5 "$limit" "$@" >"$work/$name.log" 2>&1
  status=$?
  local took=$((SECONDS - start))
  case $status in
    0) say "- \`$name\`: ok (${took} s)" ;;
    124 | 137) say "- \`$name\`: time-boxed after ${limit} s" ;;
    *) say "- \`$name\`: FAILED with status $status (${took} s)" ;;
  esac
  return $status
}

# tail_log NAME [LINES]: the end of a step's log, fenced, into the report.
tail_log() {
  local lines=${2:-15}
  if [ -s "$work/$1.log" ]; then
    {
      echo '```'
      tail -n "$lines" "$work/$1.log"
      echo '```'
    } >>"$report"
  fi
}

{
  echo "# towerpack gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo "mode: $([ "$dry" = 1 ] && echo 'dry run on the emulated device' || echo 'GPU')"
  echo "binaries: $bin ($(cat "$bin/BUILD" 2>/dev/null | head -1 || echo 'no BUILD file'))"
} >"$report"

section "Machine"
if command -v nvidia-smi >/dev/null; then
  say "$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | head -4)"
else
  say "no nvidia-smi"
fi
torch_version=$(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>/dev/null || echo "no torch")
say "PyTorch: $torch_version"
for tool in ncu compute-sanitizer ptxas; do
  say "$tool: $(command -v "$tool" || echo missing)"
done
say "host: $(nproc) cores, $(uname -sr)"

section "1. CUDA tests (TOWERPACK_TEST_CUDA=$test_device)"
# One test binary, `cuda`; each module of it that compares against the CPU backend is one run.
for t in emu_training emu_kernels emu_ops emu_tf32 emu_half; do
  filter=("$t::")
  if [ "$dry" = 1 ]; then
    case $t in
      emu_training) filter=(emu_training::a_replayed_graph_sees_the_feeds_of_every_step) ;;
      emu_kernels) filter=(emu_kernels::every_kernel_of_the_mlp_training_step_matches_the_cpu_backend) ;;
      emu_tf32) filter=(emu_tf32::a_product_in_tf32) ;;
      emu_half) filter=(emu_half::a_product_in_bf16_or_fp16) ;;
    esac
  fi
  if [ ! -x "$bin/cuda" ]; then
    say "- \`cuda\` ($t): MISSING from $bin"
    failures=$((failures + 1))
    continue
  fi
  if ! TOWERPACK_TEST_CUDA=$test_device run "$t" "${limits[0]}" "$bin/cuda" "${filter[@]}"; then
    failures=$((failures + 1))
  fi
  say "  $(grep -E '^test result' "$work/$t.log" | tail -1)"
  grep -E '^test .* FAILED$|panicked' "$work/$t.log" | head -10 | sed 's/^/  /' | tee -a "$report"
done

section "2. towerpack ResNet-20 training throughput (--device $device --bench)"
# bench NAME LABEL ARGS...: `resnet --bench ARGS` as step NAME; says LABEL with the images/s and
# leaves them in $rate ('' when the step failed).
bench() {
  local name=$1 label=$2 line
  shift 2
  rate=""
  if run "$name" "${limits[1]}" "$bin/resnet" --device "$device" --bench \
    --bench-steps "$bench_steps" --logdir "$work/bench_log" "$@"; then
    line=$(grep -E '^\{' "$work/$name.log" | tail -1)
    rate=$(printf '%s' "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["images_per_sec"])' 2>/dev/null || echo "")
    say "  $label: ${rate:-?} images/s  $line"
  else
    failures=$((failures + 1))
    tail_log "$name" 8
  fi
}
declare -A ours
for b in "${batches[@]}"; do
  bench "resnet_bench_b$b" "batch $b" --batch "$b"
  ours[$b]=$rate
done

# The batch of the ratios: 128 on a GPU, the dry run's largest.
ratio_batch=128
if [ "$dry" = 1 ]; then ratio_batch=${batches[-1]}; fi

# The same at the ratio batch with tensor-core GEMMs and convolutions: TF32, and the 16-bit
# ones of issue 17 (--precision tf32 / bf16 / fp16), each against our fp32.
declare -A precise
for p in tf32 bf16 fp16; do
  bench "resnet_bench_${p}_b$ratio_batch" \
    "batch $ratio_batch, $p (fp32: ${ours[$ratio_batch]:-?})" --precision "$p" --batch "$ratio_batch"
  precise[$p]=$rate
done

# PyTorch's step reads its loss back (loss.item()), so the host waits for every step; ours,
# with --bench-fetch-every 1, does the same (a progress bar fetching the cost every step).
declare -A fetched
for p in fp32 bf16; do
  bench "resnet_bench_${p}_fetch_b$ratio_batch" \
    "batch $ratio_batch, $p, the cost fetched every step" --precision "$p" \
    --batch "$ratio_batch" --bench-fetch-every 1
  fetched[$p]=$rate
done

section "3. PyTorch ResNet-20 on the same device ($torch_device, batch $ratio_batch)"
declare -A torch_rate
if [ "$torch_version" = "no torch" ]; then
  say "- skipped: PyTorch is not installed"
else
  if [ "$dry" = 1 ]; then
    torch_args=(--batch "${batches[-1]}" --warmup 1 --steps 2 --rounds 1)
  else
    torch_args=(--batch "$ratio_batch" --warmup 10 --steps 50 --rounds 3)
  fi
  # torch_bench NAME KEY LABEL ARGS...: pytorch_train.py's ResNet-20 in channels_last and NCHW
  # with ARGS as step NAME; each model's images/s goes to torch_rate[MODEL$KEY], said as LABEL.
  torch_bench() {
    local name=$1 key=$2 label=$3 model images
    shift 3
    if run "$name" "${limits[2]}" python3 "$bin/pytorch_train.py" resnet20 resnet20-nchw \
      --device "$torch_device" --machine "${torch_args[@]}" "$@"; then
      while read -r _ model _ images; do
        torch_rate["$model$key"]=$images
        say "  $model (channels_last unless -nchw), $label: $images images/s"
      done < <(grep -E '^train ' "$work/$name.log")
    else
      failures=$((failures + 1))
      tail_log "$name" 8
    fi
  }
  for tf32 in off on; do
    if [ "$dry" = 1 ] && [ "$tf32" = on ]; then continue; fi
    torch_bench "pytorch_tf32_$tf32" "/tf32-$tf32" "TF32 $tf32" --tf32 "$tf32"
  done
  # Automatic mixed precision in bf16 (torch.autocast; the models print as MODEL+bf16),
  # against our --precision bf16.
  torch_bench pytorch_autocast_bf16 "" "bf16 autocast" --autocast bf16
fi

section "4. The default 16-epoch ResNet-20 run (time-boxed)"
if [ "$dry" = 1 ]; then
  long=("$bin/resnet" --device "$device" --max-epoch 1 --steps-per-epoch 2 --batch 2)
else
  long=("$bin/resnet" --device "$device")
fi
run resnet_16_epochs "${limits[3]}" "${long[@]}" --fresh --logdir "$work/resnet16"
epochs=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' "$work/resnet16/stats.json" 2>/dev/null || echo 0)
say "  epochs completed: $epochs"
grep -E 'validation accuracy|finished, time' "$work/resnet_16_epochs.log" | tail -3 | sed 's/^/  /' | tee -a "$report"
# Training speed with every default callback and the NonFiniteGuard (the user's run), from the
# last whole epoch: its steps times the batch (64) over its time.
train_rate=$(python3 - "$work/resnet_16_epochs.log" <<'PY'
import re, sys
steps = [(int(g), float(t)) for g, t in re.findall(
    r"global_step (\d+)\) finished, time: ([0-9.]+) sec", open(sys.argv[1]).read())]
if len(steps) >= 2:
    print(f"{(steps[-1][0] - steps[-2][0]) * 64 / steps[-1][1]:.0f}")
PY
)
say "  training with callbacks, last epoch: ${train_rate:-?} images/s (batch 64; --bench at batch 64 above: ${ours[64]:-?})"

section "5. compute-sanitizer on a short run"
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck synccheck; do
    run "sanitizer_$tool" "${limits[4]}" compute-sanitizer --tool "$tool" --launch-count 240 \
      "$bin/resnet" --device "$device" --bench --batch 8 --bench-steps 1 --logdir "$work/san_log"
    say "  $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$work/sanitizer_$tool.log" | tail -1)"
  done
else
  say "- skipped: compute-sanitizer is not installed"
fi

section "6. mnist --device $device"
if run mnist "${limits[5]}" "$bin/mnist" --device "$device" --max-epoch "$mnist_epochs" --fresh --logdir "$work/mnist"; then
  rate=$(python3 - "$work/mnist.log" <<'PY'
import re, sys
steps = [(int(g), float(t)) for g, t in re.findall(
    r"global_step (\d+)\) finished, time: ([0-9.]+) sec", open(sys.argv[1]).read())]
if len(steps) >= 2:
    print(f"{(steps[-1][0] - steps[-2][0]) / steps[-1][1]:.0f}")
elif steps:
    print(f"{steps[0][0] / steps[0][1]:.0f}")
PY
)
  say "  ${rate:-?} steps/s in the last epoch (MLP, batch 64; reference before this work: 2,439 it/s on an H100)"
  grep -E 'validation accuracy' "$work/mnist.log" | tail -1 | sed 's/^/  /' | tee -a "$report"
else
  failures=$((failures + 1))
  tail_log mnist 8
fi

section "7. Bitwise determinism of two runs"
if [ "$dry" = 1 ]; then
  det=("$bin/mnist" --device "$device" --max-epoch 1)
else
  det=("$bin/resnet" --device "$device" --max-epoch 1 --steps-per-epoch 30 --batch 128)
fi
det_ok=1
for r in a b; do
  run "determinism_$r" "${limits[6]}" "${det[@]}" --fresh --logdir "$work/det_$r" || det_ok=0
done
if [ "$det_ok" = 1 ]; then
  verdict=$(python3 - "$work/det_a" "$work/det_b" <<'PY'
import glob, json, os, struct, sys
def tensors(d):
    files = sorted(glob.glob(os.path.join(d, "model-*.safetensors")))
    if not files:
        return None, None
    raw = open(files[-1], "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    return os.path.basename(files[-1]), {k: body[v["data_offsets"][0]:v["data_offsets"][1]]
                                         for k, v in header.items() if k != "__metadata__"}
na, a = tensors(sys.argv[1])
nb, b = tensors(sys.argv[2])
if a is None or b is None:
    print("no checkpoint to compare")
elif a.keys() != b.keys():
    print("different variables")
else:
    diff = [k for k in a if a[k] != b[k]]
    print(f"identical: {len(a)} tensors of {na}" if not diff
          else f"DIFFERENT: {len(diff)} of {len(a)} tensors, e.g. {diff[:3]}")
PY
)
  say "  $verdict"
  case $verdict in identical*) ;; *) failures=$((failures + 1)) ;; esac
else
  say "  a run failed; nothing to compare"
  failures=$((failures + 1))
fi

section "Ratios"
python3 - "$ratio_batch" "${ours[$ratio_batch]:-}" "${torch_rate[resnet20/tf32-off]:-}" \
  "${torch_rate[resnet20-nchw/tf32-off]:-}" "${torch_rate[resnet20/tf32-on]:-}" \
  "${torch_rate[resnet20-nchw/tf32-on]:-}" "${precise[tf32]:-}" "${precise[bf16]:-}" \
  "${torch_rate[resnet20+bf16]:-}" "${torch_rate[resnet20-nchw+bf16]:-}" "${fetched[fp32]:-}" \
  "${fetched[bf16]:-}" <<'PY' | tee -a "$report"
import sys
def num(s):
    try:
        return float(s)
    except ValueError:
        return None
batch = sys.argv[1]
(ours, cl_off, nchw_off, cl_on, nchw_on, ours_tf32, ours_bf16, cl_bf16, nchw_bf16,
 fetched_fp32, fetched_bf16) = map(num, sys.argv[2:])
fp32 = max([x for x in (cl_off, nchw_off) if x] or [0]) or None
tf32 = max([x for x in (cl_on, nchw_on) if x] or [0]) or None
bf16 = max([x for x in (cl_bf16, nchw_bf16) if x] or [0]) or None
print(f"towerpack ResNet-20, batch {batch}: {ours or '?'} images/s")
for what, ref in (("PyTorch's best fp32 (TF32 off)", fp32), ("PyTorch's best with TF32", tf32)):
    if ours and ref:
        print(f"  / {what} {ref:.0f} images/s = {ours / ref:.2f}x")
    else:
        print(f"  / {what}: not measured")
print(f"towerpack ResNet-20, batch {batch}, --precision tf32: {ours_tf32 or '?'} images/s")
if ours_tf32 and tf32:
    print(f"  / PyTorch's best with TF32 {tf32:.0f} images/s = {ours_tf32 / tf32:.2f}x")
print(f"towerpack ResNet-20, batch {batch}, --precision bf16: {ours_bf16 or '?'} images/s")
if ours_bf16 and bf16:
    print(f"  / PyTorch's best bf16 autocast {bf16:.0f} images/s = {ours_bf16 / bf16:.2f}x")
# PyTorch reads its loss back every step: so do these.
for what, mine, ref in (("fp32", fetched_fp32, fp32), ("bf16", fetched_bf16, bf16)):
    print(f"towerpack, {what}, the cost fetched every step: {mine or '?'} images/s")
    if mine and ref:
        print(f"  / PyTorch's best {what} {ref:.0f} images/s (its loss read every step) "
              f"= {mine / ref:.2f}x")
PY

section "Result"
say "$failures step(s) failed; run took $SECONDS s (budget $budget s)"
for f in "$work"/*.log; do
  [ -e "$f" ] || continue
  {
    echo
    echo "<details><summary>$(basename "$f")</summary>"
    echo
    echo '```'
    tail -n 40 "$f"
    echo '```'
    echo "</details>"
  } >>"$report"
done
echo "report: $report"
[ "$failures" = 0 ]
