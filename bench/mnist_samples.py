#!/usr/bin/env python
"""The MNIST sample study (chapter 13b, `dpm.mnist_study`) at book scale, on one CPU thread per model.

Trains every model of `VARIANTS` (or those named) for the same CPU time, measures it (K split over t,
the digit measures of its samples and of restarts) and writes results/mnist_samples/<name>-seed<k>.json,
one file per model, atomically. Models whose record exists are skipped, so an interrupted study goes
on where it stopped. `--long NAME` trains that model for the long budget and measures its curve.
`--jobs 2` runs two models at a time (a 2-core machine). No weights are written.

    PYTHONPATH=. python bench/mnist_samples.py --jobs 2                  # the table, seed 0
    PYTHONPATH=. python bench/mnist_samples.py earlier deeper --seed 1   # two models, another seed
    PYTHONPATH=. python bench/mnist_samples.py --long deeper             # the training curve
    DPM_SMALL=1 ... --out /tmp/study                                     # a tiny run (seconds)
"""
import argparse, os, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def one(name, seed, out, long):
    import torch
    torch.set_num_threads(1)
    from dpm.mnist_study import run_study
    t0 = time.perf_counter()
    rec = run_study(name, seed, out, long=long)
    print(f"{name}{' (long)' if long else ''} seed {seed}: {rec['steps']} steps, K {rec['K_bits']:.3f}, "
          f"FD {rec['samples']['frechet']:.1f}, confident {rec['samples']['confident']:.3f} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)


def main(argv=None):
    from dpm.mnist_study import VARIANTS, study_dir
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('names', nargs='*', help=f'models to run (default: all of {list(VARIANTS)})')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--long', default='', help='the model of the long run with its curve')
    p.add_argument('--jobs', type=int, default=1)
    p.add_argument('--out', default=str(study_dir()))
    p.add_argument('--one', action='store_true', help=argparse.SUPPRESS)   # a worker process
    a = p.parse_args(argv)
    if a.one: return one(a.names[0], a.seed, a.out, bool(a.long))
    todo = [(a.long, True)] if a.long else [(n, False) for n in (a.names or VARIANTS)]
    unknown = [n for n, _ in todo if n not in VARIANTS]
    if unknown: sys.exit(f"dpm: no study model {unknown}; known: {list(VARIANTS)}")
    todo = [(n, l) for n, l in todo
            if not (Path(a.out) / f"{n}{'-long' if l else ''}-seed{a.seed}.json").exists()]
    running = []
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONPATH': str(ROOT)}
    while todo or running:
        while todo and len(running) < a.jobs:
            n, l = todo.pop(0)
            cmd = [sys.executable, __file__, n, '--one', '--seed', str(a.seed), '--out', a.out]
            running.append(subprocess.Popen(cmd + (['--long', n] if l else []), env=env))
        time.sleep(1)
        failed = [r for r in running if r.poll() not in (None, 0)]
        if failed: sys.exit(f"dpm: a study model failed ({failed[0].args[2]})")
        running = [r for r in running if r.poll() is None]


if __name__ == '__main__':
    main()
