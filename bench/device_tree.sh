#!/usr/bin/env bash
# Moves what a GPU campaign does not read out of the working tree before a device call (the tree
# that travels to the device is limited to 64 MiB), and back afterwards, byte for byte:
#
#   bash bench/device_tree.sh away [PATH ...]   # the default list, plus PATHs (e.g. the weights
#                                               # of a run that starts afresh)
#   bash bench/device_tree.sh back              # before `INSTALL_ONLY=1 ... gpu_campaign.sh`
#
# The default list: the browser screenshots and every committed model but the digit classifier
# (the campaign trains from results/<name>_gpu/weights and measures digits with the classifier).
# Stash: $DPM_STASH (default /tmp/dpm_device_stash); `away` refuses to run over an earlier stash.
set -euo pipefail
cd "$(dirname "$0")/.."
stash=${DPM_STASH:-/tmp/dpm_device_stash}
case ${1:-} in
  away)
    shift
    [ -e "$stash" ] && { echo "dpm: $stash exists: run '$0 back' first" >&2; exit 1; }
    mkdir -p "$stash"
    paths=(results/screenshots $(ls results/models/*.pt | grep -v digit_classifier) "$@")
    for p in "${paths[@]}"; do
      [ -e "$p" ] || { echo "dpm: $p does not exist" >&2; continue; }
      mkdir -p "$stash/$(dirname "$p")"; mv "$p" "$stash/$p"; echo "moved away: $p"
    done
    echo "the tree that travels: $(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1) bytes";;
  back)
    [ -d "$stash" ] || { echo "dpm: no stash at $stash" >&2; exit 1; }
    (cd "$stash" && find . -type f -print) | while read -r f; do
      f=${f#./}; mkdir -p "$(dirname "$f")"
      if [ -e "$f" ]; then echo "kept the newer $f (not restored)"; else mv "$stash/$f" "$f"; fi
    done
    rm -rf "$stash"; echo "restored; git status:"; git status --short -- results | head -20;;
  *) echo "usage: $0 away [PATH ...] | back" >&2; exit 2;;
esac
