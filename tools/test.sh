#!/usr/bin/env bash
# The test command (README, .ci/run, .github/workflows/ci.yml): on a fresh clone it sets up the
# environment, checks that dpm/ is what the notebooks export and that the notebooks are clean,
# builds the book from scratch with warnings as errors -- which executes every notebook exactly once
# and fails on any cell error -- and then runs pytest over tests/, including tests/test_book.py,
# which checks the built HTML (every chapter rendered, with the figures its source declares), and
# tests/test_browser.py, which opens every page in Debian's headless Chromium with the network
# blocked (apt-get installs chromium here when it is missing; Playwright from the lock drives it).
# Everything runs in the small configuration (DPM_SMALL=1) unless DPM_SMALL=0.
source "$(dirname "$0")/env.sh"
export DPM_SMALL=${DPM_SMALL:-1} PYTHONHASHSEED=0
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

# Debian's chromium for tests/test_browser.py, installed while the book builds (apt-get needs root;
# `playwright install` is never used: it downloads browser builds this machine cannot fetch).
browser_log=$(mktemp)
have_browser() { [ -n "${DPM_CHROMIUM:-}" ] || [ -x /usr/lib/chromium/chromium ] ||
  command -v chromium >/dev/null || command -v google-chrome >/dev/null; }
if have_browser; then browser_pid=
elif command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) \
    >"$browser_log" 2>&1 & browser_pid=$!
else browser_pid=; echo "no chromium and no apt-get as root: tests/test_browser.py will fail (set DPM_CHROMIUM)" >&2
fi

# tools/book.sh builds it (without MPLBACKEND, so that plt.show() draws), here at DPM_SMALL=1 and
# also with --nitpick. A failed build is reported by pytest too: the HTML checks then fail, so
# pytest's closing line always tells the verdict.
step "book from scratch (executes each notebook once; a cell error fails), warnings as errors"
rm -rf _build/html _build/.doctrees _build/jupyter_execute
book=0
DPM_BOOK_CACHE=0 bash "$(dirname "$0")/book.sh" --nitpick --quiet || book=$?
[ "$book" = 0 ] || echo "FAIL: the book build exited with status $book" >&2

if [ -n "$browser_pid" ]; then
  step "waiting for apt-get install chromium"
  wait "$browser_pid" || { tail -20 "$browser_log"; echo "FAIL: apt-get install chromium failed" >&2; }
fi
rm -f "$browser_log"

step "pytest tests/ (with the checks over the built book, in Chromium too)"
tests=0
DPM_BOOK_REQUIRED=1 MPLBACKEND=Agg OMP_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider tests \
  -n 2 --dist loadfile --durations=8 || tests=$?

step "done in $((SECONDS - t0)) s"
[ "$book" = 0 ] && [ "$tests" = 0 ]
