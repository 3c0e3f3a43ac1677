#!/usr/bin/env bash
# The main job: set up the environment, execute every chapter at full scale (DPM_SMALL=0; set
# DPM_SMALL=1 for a quick draft) and write the HTML book.
source "$(dirname "$0")/env.sh"
export DPM_SMALL=${DPM_SMALL:-0} MPLBACKEND=Agg
t0=$SECONDS
jupyter-book build . --warningiserror --keep-going "$@"
echo "Book built in $((SECONDS - t0)) s. Open: file://$PWD/_build/html/index.html"
