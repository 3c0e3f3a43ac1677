#!/usr/bin/env bash
# One GPU run of the paper-scale image campaign, within DEADLINE_S = 540 s of wall time:
#
#   OUT=/tmp/out bash bench/gpu_campaign.sh          # on a GPU machine, from the repository root
#   INSTALL_ONLY=1 OUT=/tmp/out bash bench/gpu_campaign.sh   # put a returned OUT into results/
#   DEV=cpu DPM_SMALL=1 SCALE_MIN=0.05 TESTS=0 PAPER="mnist dead_leaves" SETS=steps=100000 \
#     OUT=/tmp/camp bash bench/gpu_campaign.sh       # dry run of every step on a CPU; then, after
#   (cd /tmp/cw && for b in /tmp/camp/paper/bundle_*.tar; do tar xf $b; done), the same with
#   WEIGHTS=/tmp/cw W=/tmp/w2 OUT=/tmp/camp2: dead leaves resumes from its state pack, MNIST
#   (whose state is over STATE_MB=0.1 there) warm-restarts from its model pack
#
# 1. The image bench alone on the GPU (at most 60 s): dpm's training step against the plain
#    PyTorch twin, CIFAR-10 network, batch 128, fp32 and bf16 (results/bench_images.json).
#    1b. With THROUGHPUT=1 (the default): each paper run's own training step alone on the GPU,
#    before and after the faster step (eager and literal multi-scale sum against one CUDA graph and
#    eq-net-msconv-fast; channels-last or not), steps/s, kernels and device-busy time per step
#    (bench/gpu_throughput.py, results/gpu_throughput.json). Each run then trains with the step that
#    measured fastest (graph or eager, channels-last or not), checkpointing once a minute.
# 2. Every paper-scale run (bf16 autocast, its step replayed as one CUDA graph) CONTINUES from its
#    committed files in results/<name>_gpu/weights (WEIGHTS= another folder): from its state pack
#    <name>_gpu.state.bf16.NN.pt, if there is one (its last weights, weight average and Adam's
#    moments, written back as a checkpoint by `bench/weights.py resume`: the run resumes the
#    optimisation), else from its model pack <name>_gpu.bf16.NN.pt passed as `dpm train --init`
#    (a warm restart with a fresh optimiser, chapter 05). The record sums steps and time over the
#    GPU runs and lists each restart. If the files do not fit the configuration, or were trained on
#    other training data, the run says so and starts afresh.
# 3a. The runs in ALONE (default: mnist) train alone on the GPU, one after another, in parts of
#    CURVE_MIN minutes (each ends with a checkpoint), up to GPU_MIN_ALONE minutes in all. The model
#    of each part is evaluated with `dpm evaluate` beside the next part: a point of the run's curve
#    (<name>_gpu-at-<step>/record.json, installed as results/<name>_gpu/curve/step_<step>.json).
#    After each point the stopping rule (eq-mnist-stop, bench/curve_rule.py: the Parzen estimate
#    has not risen over its last two points of the present schedule, the committed ones included)
#    may end the run; a run that the committed points have already stopped is not trained. The
#    rule's verdict over all the points goes into the final record ('stop': stopped or not, why).
# 3b. The CUDA test suite (OMP_NUM_THREADS=4), the final evaluation of the runs of 3a, and the other
#    runs of PAPER together, each trained for at most GPU_MIN minutes and then evaluated (at most
#    EVAL_S each), but only if the deadline leaves them a minute of training.
# 4. Pack: the new weights in bf16 shards under the same names (bench/weights.py), and the state of
#    each run that has steps to go if its pack is at most STATE_MB MiB (default 16: the convolutional
#    runs; MNIST and CIFAR-10's larger states would add tens of MB to the repository per run, so
#    they warm-restart instead); the shards in tar bundles of at most 15 MiB (at most 8 files come
#    back), the records and logs in one archive, all under OUT. INSTALL=1 (the default for a
#    full-scale GPU run) also puts them into results/, ready to commit: the shards replace the old
#    (a state pack not renewed is removed: it would be stale), and the record they replace is kept
#    as a point of the curve.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 DPM_SMALL=${DPM_SMALL:-0}
OUT=${OUT:-/tmp/gpu_out}; W=${W:-/tmp/gpu_work}; DEV=${DEV:-cuda}; WEIGHTS=${WEIGHTS:-results}
S=${SCALE_MIN:-1}                                      # scales the time budgets (dry runs: < 1)
DEADLINE=${DEADLINE_S:-540}                            # the whole campaign, wall seconds
GPU_MIN=${GPU_MIN:-$(python -c "print(round(6.0 * $S, 3))")}     # training minutes of each paper run, at most
BENCH_S=$(python -c "print(int(35 * $S) + 5)")         # the bench's own budget; killed after 60 s
EVAL_S=${EVAL_S:-150}; PACK_S=${PACK_S:-30}            # evaluation at most; kept for packing
START_S=${START_S:-30}; EVAL_KEEP=${EVAL_KEEP:-120}     # a run's start-up; kept for evaluating (3 at once)
STATE_MB=${STATE_MB:-16}                               # the largest state pack kept (MiB)
PAPER=${PAPER:-"mnist dead_leaves bark cifar10"}      # in order of value: MNIST first
ALONE=${ALONE-mnist}                                   # of those, the ones that train alone first
GPU_MIN_ALONE=${GPU_MIN_ALONE:-$(python -c "print(round(6.0 * $S, 3))")}  # minutes, both parts
CURVE_MIN=${CURVE_MIN:-$(python -c "print(round(2.4 * $S, 3))")}  # the first part, minutes
EVAL_ALONE=${EVAL_ALONE:-100}                          # kept for its final evaluation (seconds)
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
  for ck in "$W"/paper/*_gpu/checkpoint.pt; do             # the state of a run with steps to go
    local d n; d=$(dirname "$ck"); n=$(basename "$d")
    [ -f "$ck" ] && [ -f "$d/training.json" ] || continue
    python -c "import json, sys; sys.exit(json.load(open('$d/training.json'))['completed'])" \
      || { log "state of $n: not kept (complete)"; continue; }
    python bench/weights.py pack --state "$OUT/paper" "$ck" || continue
    if ! python -c "import os, sys; sys.exit(sum(map(os.path.getsize, sys.argv[2:])) > \
        float(sys.argv[1]) * 2 ** 20)" "$STATE_MB" "$OUT/paper/$n".state.bf16.*.pt; then
      rm -f "$OUT/paper/$n".state.bf16.*.pt
      log "state of $n: over STATE_MB=$STATE_MB MiB, not kept (the next run warm-restarts)"; fi
  done
  python bench/weights.py bundle "$OUT/paper"
  (cd "$W" && tar czf "$OUT/records.tgz" --exclude='*.pt' --exclude='*.tmp' --exclude='.lock' \
     paper logs bench_images.json throughput.json 2>/dev/null)
  ls -la "$OUT" "$OUT/paper"; du -sh "$OUT"
}

keep_point() {                # $1: a record.json -> $2/curve/step_<its steps>.json
  [ -f "$1" ] || return 0
  local k; k=$(python -c "import json; print(json.load(open('$1'))['training']['steps'])") || return
  mkdir -p "$2/curve"; cp "$1" "$2/curve/step_$k.json"; log "curve point: $2/curve/step_$k.json"
}

install() {                   # OUT -> results/: complete runs only (model and evaluation)
  log "install into results/"
  local tmp bad=0; tmp=$(mktemp -d); tar xzf "$OUT/records.tgz" -C "$tmp" || return 1
  local shards="$tmp/shards"; mkdir -p "$shards"
  for b in "$OUT"/paper/bundle_*.tar; do [ -f "$b" ] && tar xf "$b" -C "$shards"; done
  cp "$OUT"/paper/*.bf16.*.pt "$shards/" 2> /dev/null                   # shards not bundled
  for d in "$tmp"/paper/*_gpu; do
    local n; n=$(basename "$d")
    if [ ! -f "$d/record.json" ] || ! ls "$shards/$n".bf16.*.pt > /dev/null 2>&1; then
      log "install: $n has no new weights or no record (evaluation cut?): left out"; continue
    fi
    # verify before replacing: the whole pack (every shard, its sha256, a model of $n; its state
    # pack too) and the record, or nothing of $n is touched and the install fails
    if ! python bench/weights.py check --experiment "$n" "$shards/$n".bf16.*.pt \
        || { ls "$shards/$n".state.bf16.*.pt > /dev/null 2>&1 && ! python bench/weights.py check \
             --state --experiment "$n" "$shards/$n".state.bf16.*.pt; } \
        || ! python bench/weights.py summary "$d/training.json" > /dev/null; then
      log "install: $n: its new pack or record is refused (above): results/$n left as it was"
      bad=1; continue
    fi
    keep_point "results/$n/record.json" "results/$n"
    mkdir -p "results/$n/weights"; rm -f "results/$n/weights/$n".bf16.*.pt
    rm -f "results/$n/weights/$n".state.bf16.*.pt                    # stale unless renewed
    cp "$shards/$n".bf16.*.pt "results/$n/weights/"
    cp "$shards/$n".state.bf16.*.pt "results/$n/weights/" 2> /dev/null
    cp "$d"/*.json "results/$n/"; cp "$d"/*.png "results/$n/" 2> /dev/null
    log "install: $n: $(python bench/weights.py summary "$d/training.json")"
  done
  for d in "$tmp"/paper/*_gpu-at-*; do                    # points of a curve, from 3a
    [ -f "$d/record.json" ] && keep_point "$d/record.json" "results/$(basename "${d%-at-*}")"
  done
  rm -rf results/gpu_campaign; mkdir -p results/gpu_campaign; cp "$tmp"/logs/* results/gpu_campaign/
  [ -f "$tmp/bench_images.json" ] && cp "$tmp/bench_images.json" results/bench_images.json
  [ -f "$tmp/throughput.json" ] && cp "$tmp/throughput.json" results/gpu_throughput.json
  rm -rf "$tmp"
  return $bad
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

if [ "${THROUGHPUT:-1}" = 1 ]; then
  log "1b. each paper run's training step alone on the device, before and after (gpu_throughput.py)"
  tp_names=$(for e in $PAPER; do printf '%s_gpu ' "$e"; done)
  timeout "${THROUGHPUT_S:-130}" python bench/gpu_throughput.py $tp_names --device "$DEV" \
    --seconds "$(python -c "print(max(0.5, round(2.5 * $S, 1)))")" \
    --out "$W/throughput.json" > "$W/logs/throughput.log" 2>&1
  log "throughput exit $?"; tail -16 "$W/logs/throughput.log"
fi

# a checkpoint a minute, not every 500 steps (under a second at the graph's rate: the weights, the
# weight average and Adam's moments written and hashed about once a second for nothing)
extra=(--set amp=bf16 --set checkpoint_every=1000000000 --set checkpoint_minutes=1)
[ "$DEV" = cpu ] && extra=()
for kv in ${SETS:-}; do extra+=(--set "$kv"); done          # e.g. SETS="steps=80" in a dry run
step_settings() {             # $1: mnist, ...: the step that measured fastest in 1b (graph, format)
  [ "$DEV" = cpu ] && return
  python - "$1" "$W/throughput.json" <<'PY'
import json, sys
name, path = sys.argv[1] + '_gpu', sys.argv[2]
settings = dict(eager=('false', 'true'), eager_nchw=('false', 'false'), after=('true', 'true'),
                after_nchw=('true', 'false'))                  # (cuda_graph, channels_last)
try: rows = {r['variant']: r['steps_per_second'] for r in json.load(open(path))['rows']
             if r['name'] == name and r['variant'] in settings}
except (OSError, ValueError, KeyError): rows = {}
graph, last = settings[max(rows, key=rows.get)] if rows else ('true', 'true')
print(f"--set cuda_graph={graph} --set channels_last={last}")
PY
}

paper_train() {               # $1: mnist, dead_leaves, ...; $2: minutes of training at most
  local n=${1}_gpu dir="$W/paper/${1}_gpu" init=() shards rc state= extra_run
  # shellcheck disable=SC2207
  extra_run=($(step_settings "$1"))
  [ -z "${NO_STATE:-}" ] && state=$(ls "$WEIGHTS/$n/weights/$n".state.bf16.*.pt \
                                        "$WEIGHTS/$n".state.bf16.*.pt 2> /dev/null)
  if [ ! -f "$dir/checkpoint.pt" ] && [ -n "$state" ]; then
    python bench/weights.py resume --experiment "$n" "$dir/checkpoint.pt" $state \
      || echo "the state pack of $n cannot be used (above): a warm restart from its model instead"
  fi
  if [ -f "$dir/checkpoint.pt" ]; then echo "resuming from $dir/checkpoint.pt"
  else
    shards=$(ls "$WEIGHTS/$n/weights/$n".bf16.*.pt "$WEIGHTS/$n".bf16.*.pt 2> /dev/null)
    if [ -z "$shards" ]; then echo "no weights of $n in $WEIGHTS: a fresh start"
    elif python bench/weights.py unpack --experiment "$n" "$W/init/$n/model.pt" $shards; then
      init=(--init "$W/init/$n/model.pt")
    else echo "the weights of $n in $WEIGHTS cannot be unpacked: a fresh start"; fi
  fi
  train() {
    [ "$(left)" -lt 30 ] && { echo "no time left to train $n"; return 124; }
    timeout "$(left)" python -m dpm train "$n" --out "$dir" --device "$DEV" --no-progress \
      "${extra[@]}" "${extra_run[@]}" --set eval_every=0 --set n_eval=200 --set max_minutes="$2" \
      "${@:3}"
  }
  train "$1" "$2" "${init[@]}" 2> "$W/paper_$1.err"; rc=$?; cat "$W/paper_$1.err"
  if [ $rc != 0 ] && [ -n "$state" ] && [ ${#init[@]} = 0 ] && grep -q -e 'another configuration' \
      -e 'does not fit' -e 'different model' -e 'other types' -e 'other training data' \
      "$W/paper_$1.err"; then
    echo "the state pack of $n does not fit this configuration: a warm restart from its model"
    rm -f "$dir/checkpoint.pt"; NO_STATE=1 paper_train "$1" "$2"; return
  fi
  if [ $rc != 0 ] && [ ${#init[@]} -gt 0 ] && [ ! -f "$dir/checkpoint.pt" ] && grep -q \
      -e 'another configuration' -e 'different model' -e 'other types' -e 'other training data' \
      "$W/paper_$1.err"; then
    echo "the committed weights do not fit this configuration or data of $n: a fresh start"
    train "$1" "$2"; rc=$?
  fi
  rm -f "$dir/record.json"                                # a record of this run's weights or none
  echo "train exit $rc"; return $rc
}

paper_eval() {                # $1: mnist, ...; $2: the folder of its model.pt (record.json goes there)
  local ev=$(( $(left) < EVAL_S ? $(left) : EVAL_S ))
  [ $ev -gt 10 ] && timeout "$ev" python -m dpm evaluate "${1}_gpu" --out "$2" --device "$DEV"
  echo "evaluate $2: $([ -f "$2/record.json" ] && echo written || echo none)"
}

paper_run() {                 # train for TRAIN_MIN, then evaluate; output in $W/logs/paper_$1.log
  paper_train "$1" "$TRAIN_MIN" && paper_eval "$1" "$W/paper/${1}_gpu"
}

rule() {                      # $1: mnist, ...: the stopping rule (eq-mnist-stop) over the committed
  python bench/curve_rule.py "$WEIGHTS/${1}_gpu" "$W/paper/${1}_gpu"-at-* "${@:2}"  # and new points
}

alone_run() {                 # trained alone on the device in parts of CURVE_MIN minutes; the model
  local dir="$W/paper/${1}_gpu" k done pid= spent=0 part   # of each part is evaluated (a curve
                                                        # point) beside the next part's training
  if rule "$1"; then echo "$1 not trained: its stopping rule ended it"; return; fi
  while :; do
    part=$(python -c "print(round(max(0, min($CURVE_MIN, $GPU_MIN_ALONE - $spent, \
      ($(left) - $START_S - $EVAL_ALONE) / 60)), 3))")
    python -c "import sys; sys.exit($part < 0.25 * $CURVE_MIN)" || break     # too short a part
    paper_train "$1" "$part" || break
    spent=$(python -c "print($spent + $part)")
    read -r k done < <(python -c "import json; r = json.load(open('$dir/training.json'))
print(r['steps'], int(r['completed']))")
    [ "$done" = 1 ] && break
    if [ -n "$pid" ]; then                            # the last point's evaluation, then the rule
      wait "$pid"; pid=
      if rule "$1"; then echo "$1 stopped by its rule after this part"; break; fi
    fi
    mkdir -p "$dir-at-$k"; cp "$dir/model.pt" "$dir/training.json" "$dir-at-$k/"
    paper_eval "$1" "$dir-at-$k" > "$W/logs/curve_$1_$k.log" 2>&1 & pid=$!
  done
  [ -n "$pid" ] && wait "$pid"                            # (a bare `wait` would wait for tee)
}

# 3a. The runs in ALONE (default: mnist), one after another, the only training on the device. The
#     dense MNIST network was launch-bound (108.8 steps/s alone, 66.3 beside the three convolutional
#     runs); replayed as one CUDA graph it is bound by the device, and alone it reaches its budget
#     in one GPU run, with a curve point on the way. The CUDA tests run beside it (they use the
#     host's cores far more than the device).
pids=()                                                   # (a bare `wait` would wait for tee)
tests_s=$(( $(left) < 300 ? $(left) : 300 ))
if [ "${TESTS:-1}" = 1 ] && [ $tests_s -gt 30 ]; then
  log "CUDA tests (at most $tests_s s, beside the training)"
  OMP_NUM_THREADS=4 MKL_NUM_THREADS=4 timeout "$tests_s" python -m pytest -q -p no:cacheprovider \
    tests/test_fast_step.py tests/test_contract.py tests/test_posterior.py \
    tests/test_training_hardening.py tests/test_image_network.py tests/test_own_data_devices.py \
    > "$W/logs/pytest_cuda.log" 2>&1 & pids+=($!)
fi
log "3a. alone on the device: ${ALONE:-none} (at most $GPU_MIN_ALONE min each, first part $CURVE_MIN)"
for e in $ALONE; do alone_run "$e" > "$W/logs/paper_$e.log" 2>&1; done
# 3b. The final evaluations of 3a and the other runs, concurrently; the others only if the
#     deadline leaves them a minute of training beside their start-up and evaluation.
REST=$(for e in $PAPER; do [[ " $ALONE " == *" $e "* ]] || printf '%s ' "$e"; done)
TRAIN_MIN=$(python -c "print(round(min($GPU_MIN, ($(left) - $START_S - $EVAL_KEEP) / 60), 3))")
if python -c "import sys; sys.exit($TRAIN_MIN < 1 * $S)"; then RUN_REST=1; else RUN_REST=0; fi
log "3b. evaluations of ${ALONE:-none}; paper-scale runs: $([ $RUN_REST = 1 ] && \
  echo "${REST:-none} ($TRAIN_MIN min of training each)" || echo "none (no time left)")"
for e in $ALONE; do
  [ -f "$W/paper/${e}_gpu/model.pt" ] && { paper_eval "$e" "$W/paper/${e}_gpu" \
    >> "$W/logs/paper_$e.log" 2>&1 & pids+=($!); }
done
if [ $RUN_REST = 1 ]; then
  for e in $REST; do paper_run "$e" > "$W/logs/paper_$e.log" 2>&1 & pids+=($!); done
fi
[ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
for e in $ALONE; do                # the rule's verdict over all the points, in the final record
  f="$W/paper/${e}_gpu/record.json"
  [ -f "$f" ] && log "rule for $e: $(rule "$e" "$W/paper/${e}_gpu" --write "$f")"
done
for f in "$W"/logs/paper_*.log "$W"/logs/curve_*.log "$W"/logs/pytest_cuda.log; do
  [ -f "$f" ] && { log "== $(basename "$f")"; tail -4 "$f"; }
done

pack
[ "$INSTALL" = 1 ] && install
log "done ($((SECONDS - t0)) s of $DEADLINE)"
