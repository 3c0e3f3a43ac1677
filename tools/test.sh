#!/usr/bin/env bash
# The test command (README, .ci/run, .github/workflows/ci.yml): on a fresh clone it sets up the
# environment, checks that dpm/ is what the notebooks export and that the notebooks are clean,
# runs nbdev_test, pytest over tests/ with nbval over nbs/, and builds the book from scratch with
# warnings as errors. Everything runs in the small configuration (DPM_SMALL=1) unless DPM_SMALL=0.
source "$(dirname "$0")/env.sh"
export DPM_SMALL=${DPM_SMALL:-1} MPLBACKEND=Agg PYTHONHASHSEED=0
t0=$SECONDS
step() { echo; echo "== $1 ($((SECONDS - t0)) s)"; }

step "exported package matches notebooks"
nbdev_export
if [ -n "$(git status --porcelain -- dpm)" ]; then
  git status --porcelain -- dpm; git --no-pager diff --stat -- dpm
  echo "FAIL: dpm/ differs from what nbs/ exports: edit the notebooks, run nbdev_export, commit both" >&2; exit 1
fi

step "notebooks are clean"
nbdev_clean
if [ -n "$(git status --porcelain -- nbs)" ]; then
  git status --porcelain -- nbs
  echo "FAIL: notebooks are not clean: run nbdev_clean and commit" >&2; exit 1
fi

# Two notebooks run at a time on two cores: one thread each avoids oversubscription stalls.
step "nbdev_test"
OMP_NUM_THREADS=1 nbdev_test --n_workers 2 --timing

step "pytest tests/ and nbval nbs/"
OMP_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider tests nbs --nbval-lax --nbval-current-env -n 2 --dist loadfile --durations=8

step "book from scratch, warnings as errors"
rm -rf _build/html _build/.doctrees _build/jupyter_execute
jupyter-book build . --warningiserror --nitpick --keep-going --quiet

step "done in $((SECONDS - t0)) s"
