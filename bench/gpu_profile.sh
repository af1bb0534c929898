#!/usr/bin/env bash
# Where a ResNet-20 training step's GPU time goes, per kernel and per precision, with Nsight
# Compute — the companion of gpu_check.sh (same bundle: `bash bench/gpu_pack.sh`, then
# `bash gpu_bundle/gpu_profile.sh` on the GPU machine):
#
#   bash gpu_profile.sh [--out DIR] [--batch B] [--precisions "fp32 tf32 bf16 fp16"]
#                       [--bins "DIR [OLD_DIR ...]"] [--rounds N] [--ncu-precisions "..."]
#                       [--detail-precisions "..."]
#
#   1. `resnet --device cuda --bench` per precision and --bins folder, without the profiler,
#      the folders alternated, --rounds rounds (default 2): an A/B of two builds in one run;
#      and the first folder's again with TOWERPACK_CUDA_WINDOWS=0 (bin `<folder>-nowindow`:
#      the same build with the convolutions' shared-memory windows off — the stride-1 forward
#      and input-gradient ones and the filter gradients') and with TOWERPACK_CUDA_PROLOGUES=1
#      (bin `<folder>-prologue`: batch norm's apply and ReLU computed by the convolutions as
#      they stage their input, not written out; never under tf32) and, in bf16, with
#      TOWERPACK_CUDA_HALF_ACTIVATIONS=0 (bin `<folder>-f32act`: activations kept in f32, as
#      before 2026-11-29, rather than stored in bf16) and TOWERPACK_CUDA_HALF_GRADIENTS=0 (bin
#      `<folder>-f32dy`: activations in bf16, the gradients convolutions read as dy in f32);
#      then the first folder's again with --bench-fetch-every 1 and 10 (a progress bar fetching
#      the cost with every step, as tensorpack's does, and with every 10th, as ours does by
#      default); all in DIR/bench.jsonl;
#   2. per precision of --ncu-precisions (default: --precisions), the first folder's training
#      step under ncu, one row per launch: duration, grid, block, registers, shared memory,
#      achieved occupancy, SM / DRAM / L1 / L2 / tensor-pipe utilisation, L2 bytes,
#      shared-memory bank conflicts, global sectors per request and the main warp stalls
#      (ncu_<precision>.csv),
#      beside the step's launch report (launches_<precision>.jsonl: the names, in order);
#   3. per precision of --detail-precisions (default: --ncu-precisions), the full detail
#      sections (warp states, memory tables, scheduler, instructions) of three convolutions of
#      the 32x32 stage — forward, input gradient, filter gradient (detail_<precision>.txt).
# The launches ncu profiles are a steady-state step: the 5 warm-up steps are skipped. Files of
# 2 and 3 go into ONE archive, DIR/profile.tar.gz (a device call returns at most 8 files);
# the log is DIR/gpu_profile.log.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/gpu_profile_out}
batch=128
precisions="fp32 tf32 bf16 fp16"
ncu_precisions=
rounds=2
detail_precisions=-
bins=$here
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --precisions) precisions=$2; shift 2 ;;
    --bins) bins=$2; shift 2 ;;
    --ncu-precisions) ncu_precisions=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --detail-precisions) detail_precisions=$2; shift 2 ;;
    -h | --help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "gpu_profile.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
ncu_precisions=${ncu_precisions:-$precisions}
if [ "$detail_precisions" = - ]; then detail_precisions=$ncu_precisions; fi
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_profile.XXXXXX")
trap 'rm -rf "$work"' EXIT
if [ -d /usr/local/cuda/bin ]; then export PATH=$PATH:/usr/local/cuda/bin; fi
if [ -d /usr/local/cuda/lib64 ]; then
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export TOWERPACK_CUDA_CACHE=$work/ptx-cache
log=$out/gpu_profile.log
say() { printf '%s\n' "$*" | tee -a "$log"; }
say "# gpu_profile $(date -u +%Y-%m-%dT%H:%M:%SZ), batch $batch, precisions: $precisions"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$log"
if ! command -v ncu >/dev/null; then
  say "no ncu on this machine: only the benches run"
fi

# Throughput without the profiler, the --bins folders alternated, --rounds rounds; then, for
# the first folder, each precision again with a progress bar fetching the cost every step and
# every 10th step (the host waits for a fetching step before it submits the next).
bench_one() {  # FOLDER PRECISION ROUND [EXTRA FLAG] [BIN LABEL SUFFIX]
  local line
  line=$(timeout 90 "$1/resnet" --device cuda --bench --batch "$batch" --precision "$2" \
    --bench-steps 30 --logdir "$work/log" ${4:-} 2>"$work/bench.err" | grep -E '^\{' | tail -1)
  local bin
  bin=$(basename "$1")${5:-}
  say "bench round $3 $bin $2 ${4:-}: ${line:-FAILED $(tail -1 "$work/bench.err")}"
  if [ -n "$line" ]; then
    echo "{\"bin\":\"$bin\",\"round\":$3,\"precision\":\"$2\",\"flag\":\"${4:-}\",\"result\":$line}" \
      >>"$out/bench.jsonl"
  fi
}
for round in $(seq 1 "$rounds"); do
  for p in $precisions; do
    for b in $bins; do bench_one "$b" "$p" "$round"; done
    (export TOWERPACK_CUDA_WINDOWS=0; bench_one "${bins%% *}" "$p" "$round" "" -nowindow)
    if [ "$p" != tf32 ]; then
      (export TOWERPACK_CUDA_PROLOGUES=1; bench_one "${bins%% *}" "$p" "$round" "" -prologue)
    fi
    if [ "$p" = bf16 ]; then
      (export TOWERPACK_CUDA_HALF_ACTIVATIONS=0; bench_one "${bins%% *}" "$p" "$round" "" -f32act)
      (export TOWERPACK_CUDA_HALF_GRADIENTS=0; bench_one "${bins%% *}" "$p" "$round" "" -f32dy)
    fi
  done
done
for p in $precisions; do
  for every in 1 10; do bench_one "${bins%% *}" "$p" 1 "--bench-fetch-every $every"; done
done

# The metrics of the per-launch table (all of them exist on sm_80 and later).
metrics=gpu__time_duration.sum
metrics+=,launch__grid_size,launch__block_size,launch__registers_per_thread
metrics+=,launch__shared_mem_per_block_static,launch__shared_mem_per_block_dynamic
metrics+=,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem
metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active
metrics+=,sm__throughput.avg.pct_of_peak_sustained_elapsed
metrics+=,dram__throughput.avg.pct_of_peak_sustained_elapsed
# L2: the bytes it served and its busy share (are the convolutions bound by what all SMs
# request from it? docs/performance.md, windows for launches that split K).
metrics+=,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed
metrics+=,l1tex__throughput.avg.pct_of_peak_sustained_active
metrics+=,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active
metrics+=,smsp__inst_executed.sum
metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
metrics+=,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum
metrics+=,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
metrics+=,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
metrics+=,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
metrics+=,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio
metrics+=,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio
metrics+=,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio
metrics+=,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio
safe_metrics=gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread

# Launches of one step: the launch report of the same program (no GPU needed).
files=$work/files
mkdir -p "$files"
b=${bins%% *}
for p in $ncu_precisions; do
  report=$files/launches_$p.jsonl
  "$b/resnet" --batch "$batch" --precision "$p" --launch-report "$report" >/dev/null 2>&1 ||
    say "launch report of $p failed"
  step=$(wc -l <"$report" 2>/dev/null || echo 200)
  if command -v ncu >/dev/null; then
    # 5 warm-up steps (the first step also uploads and compiles): skip them.
    skip=$((step * 5))
    say "ncu $p: $step launches per step, skipping $skip"
    ncu_args=(--csv --page raw --launch-skip "$skip" --launch-count "$step")
    if ! timeout 240 ncu "${ncu_args[@]}" --metrics "$metrics" "$b/resnet" --device cuda --bench \
      --batch "$batch" --precision "$p" --bench-steps 2 --logdir "$work/log" \
      >"$files/ncu_$p.csv" 2>"$work/ncu.err"; then
      say "ncu with the full metric set failed ($(tail -2 "$work/ncu.err" | tr '\n' ' ')); safe set"
      timeout 180 ncu "${ncu_args[@]}" --metrics "$safe_metrics" "$b/resnet" --device cuda \
        --bench --batch "$batch" --precision "$p" --bench-steps 2 --logdir "$work/log" \
        >"$files/ncu_$p.csv" 2>>"$log" || say "ncu $p failed"
    fi
    for k in tp_conv2d tp_conv2d_backprop_input tp_conv2d_backprop_filter; do
      case " $detail_precisions " in *" $p "*) ;; *) break ;; esac
      # After the warm-up steps, a 16-channel 32x32 layer: the forward pass's 3rd convolution,
      # the backward pass's 3rd last of each kind.
      per_step=$(grep -c "\"body\":\"${k#tp_}.cu\"" "$report")
      at=2
      if [ "$k" != tp_conv2d ]; then at=$((per_step - 3)); fi
      timeout 90 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy \
        --section LaunchStats --section SchedulerStats --section InstructionStats \
        -k "regex:^${k}\$" --launch-skip $((per_step * 5 + at)) --launch-count 1 \
        "$b/resnet" --device cuda --bench --batch "$batch" --precision "$p" --bench-steps 1 \
        --logdir "$work/log" >>"$files/detail_$p.txt" 2>&1 || say "detail $k $p failed"
    done
  fi
  # After every precision, so that a run stopped at its time limit still returns what it did.
  tar -czf "$out/profile.tar.gz" -C "$files" . && say "profile.tar.gz: $(ls "$files" | tr '\n' ' ')"
done

say "done $(date -u +%Y-%m-%dT%H:%M:%SZ)"
