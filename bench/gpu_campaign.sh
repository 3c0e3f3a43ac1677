#!/usr/bin/env bash
# One GPU run of the image campaign (about nine minutes on one GPU machine), prepared to be run once:
#
#   OUT=/tmp/out bash bench/gpu_campaign.sh          # on the GPU machine, from the repository root
#   DEV=cpu SCALE_MIN=0.3 OUT=/tmp/out bash bench/gpu_campaign.sh   # dry run of every step on a CPU
#
# 1. The image bench alone on the GPU: dpm's training step against the plain PyTorch twin, CIFAR-10
#    network, batch 128, fp32 and bf16 (results/bench_images.json).
# 2. The CUDA test suite (tests that take a device), on the GPU.
# 3. The book-scale image models on the CPU of the same machine, two threads each, four at once:
#    a 40-step probe measures each one's rate, then `dpm train NAME --set steps=N` trains exactly the
#    N steps that fit BOOK_MIN minutes (so the run completes its budget and its record says so).
# 4. The paper-scale runs on the GPU, concurrently (bf16 autocast, channels_last), each stopped with
#    a checkpoint after GPU_MIN minutes, then `dpm evaluate` on the GPU.
# 5. Packing: the book models and records in one archive, the paper-scale weights in bf16 shards of
#    at most 15 MiB (bench/weights.py), all under OUT (at most 8 files come back).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 DPM_SMALL=${DPM_SMALL:-0}
OUT=${OUT:-/tmp/gpu_out}; W=${W:-/tmp/gpu_work}; DEV=${DEV:-cuda}
S=${SCALE_MIN:-1}                                      # scales every time budget (dry runs: < 1)
BOOK_MIN=$(python -c "print(6.5 * $S)"); GPU_MIN=$(python -c "print(5.0 * $S)")
BENCH_S=$(python -c "print(int(75 * $S) + 5)")
BOOK=${BOOK:-"dead_leaves mnist cifar10 bark"}; PAPER=${PAPER:-"mnist dead_leaves cifar10 bark"}
mkdir -p "$OUT" "$W/logs"
t0=$SECONDS
log() { echo "[$((SECONDS - t0)) s] $*"; }
pack() {                      # also on its own, after a run cut short: PACK_ONLY=1 bash ...
  log "5. pack"
  (cd "$W" && tar czf "$OUT/book.tgz" --exclude='checkpoint.pt' --exclude='*.tmp' --exclude='.lock' \
     book logs bench_images.json 2>/dev/null)
  python bench/weights.py pack "$OUT/paper" "$W"/paper/*_gpu/model.pt
  (cd "$W" && tar czf "$OUT/paper_records.tgz" --exclude='*.pt' --exclude='*.tmp' --exclude='.lock' paper)
  ls -la "$OUT" "$OUT/paper" 2>/dev/null; du -sh "$OUT"
}
if [ "${PACK_ONLY:-0}" = 1 ]; then pack; exit; fi
log "machine"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
python -c 'import torch, sys, os; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available(), os.cpu_count())'

log "3. book-scale trainings on the CPU (probe, then exactly N steps), in the background"
for e in $BOOK; do
  ( export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
    n=$(python bench/probe_steps.py "$e" --minutes "$BOOK_MIN" --threads 2 2>>"$W/logs/$e.probe")
    echo "steps $n" >> "$W/logs/$e.probe"
    python -m dpm train "$e" --out "$W/book/$e" --device cpu --no-progress --set steps="$n" \
      --set max_minutes=$(python -c "print(1.6 * $BOOK_MIN)") ) > "$W/logs/book_$e.log" 2>&1 &
done

log "1. bench, alone on the GPU"
cp results/bench_images.json "$W/bench_images.json"
modes=fp32,bf16; [ "$DEV" = cpu ] && modes=fp32
timeout $((BENCH_S + 60)) python bench/bench_images.py --device "$DEV" --archs cifar10 --batch 128 \
  --modes $modes --budget "$BENCH_S" --out "$W/bench_images.json" > "$W/logs/bench.log" 2>&1
log "bench exit $?"; tail -12 "$W/logs/bench.log"

log "2. CUDA tests, 4. paper-scale runs, concurrently"
[ "${TESTS:-1}" = 1 ] && timeout 300 python -m pytest -q -p no:cacheprovider -x tests/test_contract.py \
  tests/test_posterior.py tests/test_training_hardening.py tests/test_image_network.py \
  > "$W/logs/pytest_cuda.log" 2>&1 &
extra=(--set amp=bf16 --set channels_last=true); [ "$DEV" = cpu ] && extra=()
for e in $PAPER; do
  ( python -m dpm train "${e}_gpu" --out "$W/paper/${e}_gpu" --device "$DEV" --no-progress \
      "${extra[@]}" --set eval_every=0 --set n_eval=200 --set max_minutes="$GPU_MIN" \
    && timeout 150 python -m dpm evaluate "${e}_gpu" --out "$W/paper/${e}_gpu" --device "$DEV" ) \
    > "$W/logs/paper_${e}.log" 2>&1 &
done
wait
for f in "$W"/logs/*; do log "== $(basename "$f")"; tail -6 "$f"; done

pack
log "done"
