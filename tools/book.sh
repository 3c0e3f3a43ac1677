#!/usr/bin/env bash
# The main job: set up the environment, execute every chapter once at full scale (DPM_SMALL=0; set
# DPM_SMALL=1 for a quick draft) and write the HTML book. Extra arguments go to jupyter-book build.
source "$(dirname "$0")/env.sh"
export DPM_SMALL=${DPM_SMALL:-0}
# The kernels must draw with matplotlib's inline backend (ipykernel's default): an inherited
# MPLBACKEND=Agg makes every plt.show() a no-op and the book would have no figures. Scripts and the
# CLI choose Agg themselves.
unset MPLBACKEND
t0=$SECONDS
# --all: Sphinx re-reads (so re-executes) only changed sources by default; a book built at the
# other scale (e.g. by tools/test.sh, DPM_SMALL=1) would be kept and labelled as this one.
jupyter-book build . --all --warningiserror --keep-going "$@"
echo "Book built in $((SECONDS - t0)) s. Open: file://$PWD/_build/html/index.html"
