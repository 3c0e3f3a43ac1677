#!/usr/bin/env bash
# One GPU session of the image experiments: what produced the GPU figures of results/bench_images.json,
# the book-scale models results/models/{mnist,cifar10,bark}.pt (trained on the GPU with the CPU book
# configuration) and the paper-scale records results/<name>_gpu/record.json.
#
#   OUT=/tmp/gpu_out timeout 560 bash bench/gpu_session.sh; PACK_ONLY=1 bash bench/gpu_session.sh
#   DEV=cpu DPM_SMALL=1 TRAIN_MIN=0.2 BENCH_S=60 bash bench/gpu_session.sh   # dry run of every step
#
# Steps: (1) the image bench alone on the GPU; (2) the book-scale trainings and the paper-scale runs
# concurrently (the paper-scale runs stop after TRAIN_MIN minutes and are resumable from their
# checkpoints); (3) `dpm evaluate` of each; (4) everything but checkpoints packed into OUT/results.tgz.
# Runs share the GPU, so their images/s are lower than the bench's; each record says so.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DPM_SMALL=${DPM_SMALL:-0} OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
OUT=${OUT:-/tmp/gpu_out}; W=${W:-/tmp/gpu_work}; DEV=${DEV:-cuda}
BENCH_S=${BENCH_S:-120}; TRAIN_MIN=${TRAIN_MIN:-3}; EVAL_S=${EVAL_S:-150}
BOOK=${BOOK:-"mnist cifar10 bark"}; PAPER=${PAPER:-"dead_leaves mnist cifar10 bark"}
EVAL_ONLY=${EVAL_ONLY:-"dead_leaves"}     # book-scale models trained on CPU and committed: evaluated only
mkdir -p "$OUT" "$W/logs"
t0=$SECONDS
pack() {
  cp "$W/bench_images.json" "$OUT/" 2>/dev/null
  # paper-scale weights stay behind (CIFAR-10's are 37 MB) except dead leaves' (5.5 MB, committed)
  cp "$W/dead_leaves_gpu/model.pt" "$OUT/dead_leaves_gpu_model.pt" 2>/dev/null
  (cd "$W" && tar czf "$OUT/results.tgz" --exclude='checkpoint.pt' --exclude='*.tmp' \
    --exclude='.lock' --exclude='samples.pt' --exclude='*_gpu/model.pt' $(ls))
  ls -la "$OUT"
}
if [ "${PACK_ONLY:-0}" = 1 ]; then pack; exit; fi   # after a run cut short by an outer timeout
log() { echo "[$((SECONDS - t0)) s] $*"; }

log "machine"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
python -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())'

log "1. bench (alone on the device, at most $BENCH_S s)"
modes=fp32,bf16,bf16_cl,bf16_cl_compile; [ "$DEV" = cpu ] && modes=fp32
cp results/bench_images.json "$W/bench_images.json"    # the bench adds this device's entries to the file
timeout $((BENCH_S + 20)) python bench/bench_images.py --device "$DEV" --modes $modes \
  --budget "$BENCH_S" --out "$W/bench_images.json" > "$W/logs/bench.log" 2>&1
log "bench exit $?"; tail -25 "$W/logs/bench.log"

log "2. trainings, concurrently (and the CUDA halves of the contract and device tests)"
timeout 240 python -m pytest -q -p no:cacheprovider tests/test_contract.py tests/test_posterior.py \
  tests/test_core_hardening.py tests/test_training_hardening.py > "$W/logs/pytest_cuda.log" 2>&1 &
extra_gpu=(--set amp=bf16 --set channels_last=true); [ "$DEV" = cpu ] && extra_gpu=()
for e in $BOOK; do
  ( timeout $((60 * 5 + 30)) python -m dpm train "$e" --out "$W/$e" --device "$DEV" --no-progress \
      --set max_minutes=5 \
      && timeout "$EVAL_S" python -m dpm evaluate "$e" --out "$W/$e" --device "$DEV" ) \
    > "$W/logs/$e.log" 2>&1 &
done
for e in $EVAL_ONLY; do
  mkdir -p "$W/$e"; cp "results/models/$e.pt" "$W/$e/model.pt"
  timeout "$EVAL_S" python -m dpm evaluate "$e" --out "$W/$e" --device "$DEV" > "$W/logs/$e.log" 2>&1 &
done
# The bound sums all T = 1000 steps in float32: 200 held-out images keep the conv nets' evaluation
# to about a minute on a shared GPU (MNIST's dense net is cheap: its default n_eval stays).
for e in $PAPER; do
  n_eval=(--set n_eval=200); [ "$e" = mnist ] && n_eval=()
  ( python -m dpm train "${e}_gpu" --out "$W/${e}_gpu" --device "$DEV" --no-progress \
      "${extra_gpu[@]}" "${n_eval[@]}" --set eval_every=0 --set max_minutes="$TRAIN_MIN" \
      && timeout "$EVAL_S" python -m dpm evaluate "${e}_gpu" --out "$W/${e}_gpu" --device "$DEV" ) \
    > "$W/logs/${e}_gpu.log" 2>&1 &
done
wait
for f in "$W"/logs/*.log; do log "== $(basename "$f")"; tail -8 "$f"; done

log "3. pack"; pack; log "done"
