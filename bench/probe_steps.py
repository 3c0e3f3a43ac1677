#!/usr/bin/env python
"""How many training steps of an experiment fit in a time budget on this machine: times a few steps
of `dpm.training.train` (after a warm-up) with the given threads and prints the whole number of
steps that fit --minutes, less a margin for the model's build, checkpoints and final save.

    python bench/probe_steps.py mnist --minutes 7 --threads 2     # prints e.g. 21000
"""
import argparse, os, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('experiment'); p.add_argument('--minutes', type=float, required=True)
    p.add_argument('--threads', type=int, default=2); p.add_argument('--probe', type=int, default=40)
    p.add_argument('--margin', type=float, default=0.85, help='fraction of the budget to fill')
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from dpm.cli import get_experiment
    from dpm.training import train, TrainConfig
    from dpm.experiments import build
    exp = get_experiment(a.experiment)
    cfg = exp.resolve(dict(steps=10 + a.probe, eval_every=0)); cfg['seed'] = 0
    t_build = time.perf_counter()
    d, reverse = build(exp, cfg, 0, 'cpu')
    train_x, held = exp.data(cfg, 0)
    t_build = time.perf_counter() - t_build
    tc = TrainConfig.from_dict(cfg)
    t = time.perf_counter(); train(d, reverse, train_x, None, TrainConfig.from_dict({**cfg, 'steps': 10}),
                                   progress=False); warm = time.perf_counter() - t
    d, reverse = build(exp, cfg, 0, 'cpu')
    t = time.perf_counter(); train(d, reverse, train_x, None, tc, progress=False)
    rate = (a.probe + 10) / (time.perf_counter() - t)
    budget = 60 * a.minutes * a.margin - 2 * t_build
    steps = max(100, int(rate * budget) // 100 * 100)
    print(f"{a.experiment}: build {t_build:.1f} s, warm-up {warm:.1f} s, {rate:.1f} steps/s with "
          f"{a.threads} threads on {os.cpu_count()} CPUs -> {steps} steps", file=sys.stderr)
    print(steps)

if __name__ == '__main__': main()
