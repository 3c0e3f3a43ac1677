#!/usr/bin/env bash
# One GPU run of the paper-scale image campaign, within DEADLINE_S = 540 s of wall time:
#
#   OUT=/tmp/out bash bench/gpu_campaign.sh          # on a GPU machine, from the repository root
#   INSTALL_ONLY=1 OUT=/tmp/out bash bench/gpu_campaign.sh   # put a returned OUT into results/
#   DEV=cpu DPM_SMALL=1 SCALE_MIN=0.05 TESTS=0 PAPER=mnist OUT=/tmp/camp bash bench/gpu_campaign.sh
#                                                    # dry run of every step on a CPU; again
#   with WEIGHTS=/tmp/camp/paper W=/tmp/w2 SETS=steps=80 OUT=/tmp/camp2: a warm restart from it
#
# 1. The image bench alone on the GPU (at most 60 s): dpm's training step against the plain
#    PyTorch twin, CIFAR-10 network, batch 128, fp32 and bf16 (results/bench_images.json).
#    1b. Each paper run's own training step alone on the GPU, 8 s each after a warm-up
#    (bench/gpu_throughput.py, results/gpu_throughput.json), to set beside the rates the runs get
#    all at once in step 3 (their training.json).
# 2. The CUDA test suite (tests that take a device), on the GPU, its CPU threads limited
#    (OMP_NUM_THREADS=4) so that it does not starve the runs of step 3 of their CPU.
# 3. The paper-scale runs on the GPU, concurrently (bf16 autocast, channels_last). Each one CONTINUES
#    from its committed weights, results/<name>_gpu/weights/<name>_gpu.bf16.NN.pt (WEIGHTS= another
#    folder), unpacked by bench/weights.py and passed as `dpm train --init`: a warm restart (chapter
#    05; the record sums steps and time over the GPU runs and lists the restarts), unless its work
#    folder has a checkpoint (then it resumes). If the weights do not fit the configuration, or were
#    trained on other training data, the run says so and starts afresh. Each is stopped with a
#    checkpoint after GPU_MIN = 6 minutes of training (less if the deadline asks), then
#    `dpm evaluate` (at most EVAL_S = 120 s).
# 4. Pack: the new weights in bf16 shards under the same names (bench/weights.py), the records and
#    logs in one archive, all under OUT (at most 8 files come back). INSTALL=1 (the default for a
#    full-scale GPU run) also puts them into results/, ready to commit: the shards replace the old.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 DPM_SMALL=${DPM_SMALL:-0}
OUT=${OUT:-/tmp/gpu_out}; W=${W:-/tmp/gpu_work}; DEV=${DEV:-cuda}; WEIGHTS=${WEIGHTS:-results}
S=${SCALE_MIN:-1}                                      # scales the time budgets (dry runs: < 1)
DEADLINE=${DEADLINE_S:-540}                            # the whole campaign, wall seconds
GPU_MIN=${GPU_MIN:-$(python -c "print(round(6.0 * $S, 3))")}     # training minutes of each paper run, at most
BENCH_S=$(python -c "print(int(35 * $S) + 5)")         # the bench's own budget; killed after 60 s
EVAL_S=${EVAL_S:-150}; PACK_S=${PACK_S:-30}            # evaluation at most; kept for packing
START_S=${START_S:-40}; EVAL_KEEP=${EVAL_KEEP:-150}     # a run's start-up; kept for evaluating (4 at once: 105+ s)
PAPER=${PAPER:-"mnist dead_leaves bark cifar10"}      # in order of value: MNIST first
full=0; [ "$DEV" != cpu ] && [ "$DPM_SMALL" = 0 ] && [ "$S" = 1 ] && full=1
INSTALL=${INSTALL:-$full}
t0=$SECONDS
log() { echo "[$((SECONDS - t0)) s] $*"; }
left() { echo $((DEADLINE - PACK_S - (SECONDS - t0))); }       # seconds until packing must start

pack() {                      # also on its own, after a run cut short: PACK_ONLY=1 bash ...
  log "4. pack"
  rm -rf "$OUT/paper" "$OUT/records.tgz"; mkdir -p "$OUT/paper"
  models=("$W"/paper/*_gpu/model.pt)
  [ -f "${models[0]}" ] && python bench/weights.py pack "$OUT/paper" "${models[@]}"
  (cd "$W" && tar czf "$OUT/records.tgz" --exclude='*.pt' --exclude='*.tmp' --exclude='.lock' \
     paper logs bench_images.json throughput.json 2>/dev/null)
  ls -la "$OUT" "$OUT/paper"; du -sh "$OUT"
}

install() {                   # OUT -> results/: complete runs only (model and evaluation)
  log "install into results/"
  local tmp; tmp=$(mktemp -d); tar xzf "$OUT/records.tgz" -C "$tmp" || return 1
  for d in "$tmp"/paper/*_gpu; do
    local n; n=$(basename "$d")
    if [ ! -f "$d/record.json" ] || ! ls "$OUT/paper/$n".bf16.*.pt > /dev/null 2>&1; then
      log "install: $n has no new weights or no record (evaluation cut?): left out"; continue
    fi
    mkdir -p "results/$n/weights"; rm -f "results/$n/weights/$n".bf16.*.pt
    cp "$OUT/paper/$n".bf16.*.pt "results/$n/weights/"
    cp "$d"/*.json "results/$n/"; cp "$d"/*.png "results/$n/" 2> /dev/null
    log "install: $n: $(python bench/weights.py summary "$d/training.json")"
  done
  rm -rf results/gpu_campaign; mkdir -p results/gpu_campaign; cp "$tmp"/logs/* results/gpu_campaign/
  [ -f "$tmp/bench_images.json" ] && cp "$tmp/bench_images.json" results/bench_images.json
  [ -f "$tmp/throughput.json" ] && cp "$tmp/throughput.json" results/gpu_throughput.json
  rm -rf "$tmp"
}

if [ "${INSTALL_ONLY:-0}" = 1 ]; then install; exit; fi
mkdir -p "$OUT" "$W/logs" "$W/paper" "$W/init"
if [ "${PACK_ONLY:-0}" = 1 ]; then pack; exit; fi
exec > >(tee -a "$W/logs/campaign.log") 2>&1
log "machine (deadline $DEADLINE s, at most $GPU_MIN min of training per run)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
python -c 'import torch, sys, os
print(sys.version.split()[0], torch.__version__, torch.cuda.is_available(), os.cpu_count())'

log "1. bench, alone on the GPU"
cp results/bench_images.json "$W/bench_images.json"
modes=fp32,bf16; [ "$DEV" = cpu ] && modes=fp32
timeout 60 python bench/bench_images.py --device "$DEV" --archs cifar10 --batch 128 \
  --modes $modes --budget "$BENCH_S" --out "$W/bench_images.json" > "$W/logs/bench.log" 2>&1
log "bench exit $?"; tail -4 "$W/logs/bench.log"

log "1b. each paper run's training step alone on the device (bench/gpu_throughput.py)"
tp_names=$(for e in $PAPER; do printf '%s_gpu ' "$e"; done)
timeout "${THROUGHPUT_S:-75}" python bench/gpu_throughput.py $tp_names --device "$DEV" \
  --seconds "$(python -c "print(max(1, round(8 * $S, 1)))")" --warmup 2 \
  --out "$W/throughput.json" > "$W/logs/throughput.log" 2>&1
log "throughput exit $?"; tail -4 "$W/logs/throughput.log"

# training minutes: GPU_MIN, or what the deadline leaves after start-up, evaluation and packing
TRAIN_MIN=$(python -c "print(round(min($GPU_MIN, ($(left) - $START_S - $EVAL_KEEP) / 60), 3))")
log "2. CUDA tests, 3. paper-scale runs ($TRAIN_MIN min of training each), concurrently"
tests_s=$(( $(left) < 300 ? $(left) : 300 ))
pids=()                                                   # (a bare `wait` would wait for tee)
if [ "${TESTS:-1}" = 1 ] && [ $tests_s -gt 30 ]; then
  OMP_NUM_THREADS=4 MKL_NUM_THREADS=4 timeout "$tests_s" python -m pytest -q -p no:cacheprovider \
    -x tests/test_contract.py tests/test_posterior.py tests/test_training_hardening.py \
    tests/test_image_network.py > "$W/logs/pytest_cuda.log" 2>&1 & pids+=($!)
fi
extra=(--set amp=bf16 --set channels_last=true); [ "$DEV" = cpu ] && extra=()
for kv in ${SETS:-}; do extra+=(--set "$kv"); done          # e.g. SETS="steps=80" in a dry run

paper_run() {                 # $1: mnist, dead_leaves, ...; output in $W/logs/paper_$1.log
  local n=${1}_gpu dir="$W/paper/${1}_gpu" init=() shards rc
  if [ -f "$dir/checkpoint.pt" ]; then echo "resuming from $dir/checkpoint.pt"
  else
    shards=$(ls "$WEIGHTS/$n/weights/$n".bf16.*.pt "$WEIGHTS/$n".bf16.*.pt 2> /dev/null)
    if [ -z "$shards" ]; then echo "no weights of $n in $WEIGHTS: a fresh start"
    elif python bench/weights.py unpack "$W/init/$n/model.pt" $shards; then
      init=(--init "$W/init/$n/model.pt")
    else echo "the weights of $n in $WEIGHTS cannot be unpacked: a fresh start"; fi
  fi
  train() {
    [ "$(left)" -lt 30 ] && { echo "no time left to train $n"; return 124; }
    timeout "$(left)" python -m dpm train "$n" --out "$dir" --device "$DEV" --no-progress \
      "${extra[@]}" --set eval_every=0 --set n_eval=200 --set max_minutes="$TRAIN_MIN" "$@"
  }
  train "${init[@]}" 2> "$W/paper_$1.err"; rc=$?; cat "$W/paper_$1.err"
  if [ $rc != 0 ] && [ ${#init[@]} -gt 0 ] && [ ! -f "$dir/checkpoint.pt" ] && grep -q \
      -e 'another configuration' -e 'different model' -e 'other types' -e 'other training data' \
      "$W/paper_$1.err"; then
    echo "the committed weights do not fit this configuration or data of $n: a fresh start"
    train; rc=$?
  fi
  rm -f "$dir/record.json"                                # a record of this run's weights or none
  local ev=$(( $(left) < EVAL_S ? $(left) : EVAL_S ))
  [ $rc = 0 ] && [ $ev -gt 10 ] && timeout "$ev" python -m dpm evaluate "$n" --out "$dir" \
    --device "$DEV"
  echo "train exit $rc; evaluate: $([ -f "$dir/record.json" ] && echo written || echo none)"
}
for e in $PAPER; do paper_run "$e" > "$W/logs/paper_$e.log" 2>&1 & pids+=($!); done
[ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
for f in "$W"/logs/paper_*.log "$W"/logs/pytest_cuda.log; do
  [ -f "$f" ] && { log "== $(basename "$f")"; tail -4 "$f"; }
done

pack
[ "$INSTALL" = 1 ] && install
log "done ($((SECONDS - t0)) s of $DEADLINE)"
