#!/usr/bin/env bash
# The main job: set up the environment, execute every chapter once at full scale (DPM_SMALL=0; set
# DPM_SMALL=1 for a quick draft) and write the HTML book. Extra arguments go to jupyter-book build.
source "$(dirname "$0")/env.sh"
export DPM_SMALL=${DPM_SMALL:-0}
# The kernels must draw with matplotlib's inline backend (ipykernel's default): an inherited
# MPLBACKEND=Agg makes every plt.show() a no-op and the book would have no figures. Scripts and the
# CLI choose Agg themselves.
unset MPLBACKEND
# Every kernel of the build starts with tools/figure_fonts.py (a startup file of an IPython profile
# under _build): the figures' matplotlib baseline, and a record of the smallest text of each figure
# drawn, which tests/test_book.py checks as the page renders it.
export IPYTHONDIR=$PWD/_build/ipython
rm -rf _build/figure_fonts "$IPYTHONDIR"
python tools/figure_fonts.py "$IPYTHONDIR/profile_default/startup" _build/figure_fonts
t0=$SECONDS
# --all: Sphinx re-reads (so re-executes) only changed sources by default; a book built at the
# other scale (e.g. by tools/test.sh, DPM_SMALL=1) would be kept and labelled as this one.
jupyter-book build . --all --warningiserror --keep-going "$@"
echo "Book built in $((SECONDS - t0)) s. Open: file://$PWD/_build/html/index.html"
