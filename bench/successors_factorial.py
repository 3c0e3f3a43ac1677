#!/usr/bin/env python
"""The successors' factorial design (chapter 15b, `dpm.factorial.study_cells`), one thread.

For one data set, every cell of the design (kernel x variance x loss x schedule, the combinations
that are not models left out; on MNIST also the cell of DDPM's U-Net trunk) and every seed:
train for a budget of steps or CPU minutes, whichever ends first, scoring the averaged weights
at 1k, 2k, 4k, 8k and 16k steps; then K on held-out data with every t, as specified and with
each one-step fix, split into bands of t and paired; samples scored by the data set's measure.
One JSON record per (data set, cell, seed), written atomically; a cell whose record exists is
skipped, so the study resumes where it stopped.

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/successors_factorial.py --data swiss_roll \\
        --seeds 0 1 2 --minutes 5
    ... --cells 'eps_skip-*-simple-*'        # shell-style patterns over the cell names
    ... --list                               # the cells, and nothing run
    ... --data mnist --cells 'unet-*' --minutes M   # the U-Net at the book trunk's CPU time: M
        # the mean cpu_seconds / 60 of the eps_skip-beta_tilde-simple-base records (2.065 here)
    ... --data mnist --cells 'unet-*' --steps 4000 --minutes 60 \\
        --out results/successors/factorial_steps       # the U-Net at the book trunk's steps
    ... --data mnist --cells reference-learned-K-base --steps 16000 --minutes 30 \
        --curve-samples 200 --out results/successors/factorial_long   # curves with samples
"""
import argparse, fnmatch, sys, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dpm.successors import DATA_SETS
from dpm.factorial import CHECKPOINTS, study_cells, run_cell


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--data', choices=DATA_SETS, required=True)
    p.add_argument('--seeds', type=int, nargs='+', default=[0])
    p.add_argument('--minutes', type=float, default=10.0, help='CPU minutes of training per cell')
    p.add_argument('--steps', type=int, default=CHECKPOINTS[-1], help='at most this many steps')
    p.add_argument('--cells', nargs='+', default=['*'], help='cell names or shell patterns')
    p.add_argument('--out', default=str(ROOT / 'results' / 'successors' / 'factorial'))
    p.add_argument('--curve-samples', type=int, default=0,
                   help='also score this many samples at each curve point')
    p.add_argument('--list', action='store_true', help='print the chosen cells and stop')
    a = p.parse_args(argv)
    if a.minutes <= 0 or a.steps < 1 or a.curve_samples < 0:
        p.error('--minutes must be > 0, --steps >= 1 and --curve-samples >= 0')
    extra = dict(n_curve_samples=a.curve_samples) if a.curve_samples else {}
    torch.set_num_threads(1)
    cells = [c for c in study_cells(a.data) if any(fnmatch.fnmatch(c, pat) for pat in a.cells)]
    if not cells: p.error(f"no cell matches {a.cells}; try --list")
    if a.list: print('\n'.join(cells)); return
    out = Path(a.out)
    for seed in a.seeds:
        for cell in cells:
            path = out / f'{a.data}-{cell}-seed{seed}.json'
            if path.exists(): print(f'{path.name}: exists, skipped'); continue
            t0 = time.perf_counter()
            r = run_cell(a.data, cell, seed, a.steps, 60 * a.minutes, out, **extra)
            if 'failed' in r: print(f"{path.name}: failed ({r['failed']})"); continue
            v = r['variants']
            fixes = '  '.join(f"{k} {v[k]['minus_reference_bits']:+.3f}"
                              f"±{v[k]['minus_reference_se']:.3f}"
                              for k in ('fix_first', 'clip_x0', 'both'))
            print(f"{path.name}: {r['steps']} steps, {1e3 * r['cpu_per_step']:.1f} ms/step, "
                  f"K {v['as_specified']['K_bits']:.3f} {r['unit']}; {fixes}; "
                  f"{time.perf_counter() - t0:.0f} s")


if __name__ == '__main__':
    main()
