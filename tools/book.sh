#!/usr/bin/env bash
# The main job: set up the environment, execute every chapter at full scale (DPM_SMALL=0; set
# DPM_SMALL=1 for a quick draft) and write the HTML book. Extra arguments go to jupyter-book build.
#
# Chapters run first in tools/execute_book.py: each prints its name and seconds (a warning when over
# its budget in tools/book_budgets.tsv), two at a time, and the executed notebooks are kept in a
# cache per scale (_build/.jupyter_cache/{small,full}); jupyter-book then reads them from there.
# A second build executes only the chapters whose code changed; a change in dpm/, results/ or the
# figure-font hook clears the cache. DPM_BOOK_CACHE=clear clears this scale's cache first (every
# chapter runs again, two at a time); DPM_BOOK_CACHE=0 builds from scratch with jupyter-book's own
# execution, one chapter at a time and no cache (`execute_notebooks: force` in _config.yml), as
# tools/test.sh does. DPM_BOOK_JOBS and DPM_BOOK_THREADS set the chapters at a time (2) and the
# threads of each (cores / jobs).
source "$(dirname "$0")/env.sh"
export DPM_SMALL=${DPM_SMALL:-0}
# The kernels must draw with matplotlib's inline backend (ipykernel's default): an inherited
# MPLBACKEND=Agg makes every plt.show() a no-op and the book would have no figures. Scripts and the
# CLI choose Agg themselves.
unset MPLBACKEND
# A built book has no kernel to drive an ipywidgets control, and executing a cell that makes one can
# leave nbclient waiting forever for the cell's reply (seen twice, chapters 07 and 08, on a loaded
# 2-core machine; jupyter/nbclient#312): the chapters' widget cells draw their first view instead.
export DPM_WIDGETS=0
# Every kernel of the build starts with tools/figure_fonts.py (a startup file of an IPython profile
# under _build): the figures' matplotlib baseline, and a record of the smallest text of each figure
# drawn, which tests/test_book.py checks as the page renders it. (tools/execute_book.py gives each of
# its kernels a profile of its own, keeps the records with the cache and copies them here.)
export IPYTHONDIR=$PWD/_build/ipython
rm -rf _build/figure_fonts "$IPYTHONDIR"
python tools/figure_fonts.py "$IPYTHONDIR/profile_default/startup" _build/figure_fonts
t0=$SECONDS
config=()
case ${DPM_BOOK_CACHE:-1} in 0|1|clear) ;; *) echo "DPM_BOOK_CACHE must be 1, clear or 0" >&2; exit 2;; esac
if [ "${DPM_BOOK_CACHE:-1}" != 0 ]; then
  force=(); [ "${DPM_BOOK_CACHE:-1}" = clear ] && force=(--force)
  python tools/execute_book.py --records _build/figure_fonts --config-out _build/_config.cache.yml \
    "${force[@]}"
  config=(--config _build/_config.cache.yml)
else
  echo "executing every chapter in jupyter-book (DPM_BOOK_CACHE=0, no cache)"
fi
t1=$SECONDS
# --all: Sphinx re-reads every source (from the cache: nothing runs twice); otherwise it would keep
# the pages of a book built at the other scale (e.g. by tools/test.sh, DPM_SMALL=1).
jupyter-book build . --all --warningiserror --keep-going "${config[@]}" "$@"
echo "Book built in $((SECONDS - t0)) s (chapters $((t1 - t0)) s, pages $((SECONDS - t1)) s)." \
     "Open: file://$PWD/_build/html/index.html"
