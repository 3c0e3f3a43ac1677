#!/usr/bin/env python
"""The successors' ladder (chapter 15a, `dpm.successors`) at book scale on one CPU thread.

For one data set (swiss_roll, dead_leaves, mnist) every LADDER variant gets the same trunk, the
same diffusion (the cosine row its own), the same seed, the same number of steps and batch
(`LADDER_BUDGET`); then K of each (every t, held-out data, common noise) paired against the 2015
reference form and against the row above it, and ancestral samples. Writes
results/successors/<data>.json (numbers, per-t KL curves, seconds per step, machine, seed, steps)
and results/successors/<data>_samples.png. No weights are written.

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/successors.py swiss_roll
    DPM_SMALL=1 ... python bench/successors.py mnist --out /tmp/x      # a tiny run (a smoke test)
"""
import argparse, sys, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dpm.config import small_scale
from dpm.files import write_json
from dpm.experiments import machine
from dpm.successors import (DATA_SETS, LADDER_BUDGET, ladder_setup, ladder_models, run_ladder,
                            sample_figure)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('data', choices=DATA_SETS)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default=str(ROOT / 'results' / 'successors'))
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    import matplotlib; matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    b = {k: v for k, v in LADDER_BUDGET[a.data].items() if k != 'n_eval'}
    cfg, d, make, train, heldout = ladder_setup(a.data, a.seed)
    models = ladder_models(make, d, a.seed)
    t0 = time.perf_counter()
    records = run_ladder(models, train, heldout, b.pop('steps'), b.pop('batch_size'),
                         seed=a.seed, per_dim=a.data != 'swiss_roll', **b)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(): fig = sample_figure(models, tuple(train.shape[1:]), seed=a.seed)
    fig.savefig(out / f'{a.data}_samples.png', dpi=110); plt.close(fig)
    unit = 'bits per example' if a.data == 'swiss_roll' else 'bits per dimension'
    write_json(dict(data=a.data, unit=unit, T=d.T, beta_1=d.betas[0].item(), seed=a.seed,
                    n_heldout=len(heldout), small=small_scale(), machine=machine(),
                    note='one torch thread on a 2-core VM shared with other jobs; no weights kept',
                    seconds=time.perf_counter() - t0, variants=records), out / f'{a.data}.json')
    for name, r in records.items():
        print(f"{a.data:11s} {name:13s} K {r['K_bits']:8.4f} ± {r['K_bits_se']:.4f}  "
              f"- ref {r['minus_reference_bits']:+.4f} ± {r['minus_reference_se']:.4f}  "
              f"{1e3 * r['seconds_per_step']:.1f} ms/step")


if __name__ == '__main__':
    main()
