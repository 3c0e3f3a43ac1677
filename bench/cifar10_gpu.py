#!/usr/bin/env python
"""CIFAR-10 on one GPU, both scales of chapter 14, in one call:

1. `cifar10` (CPU book scale: 16x16 crops, T=100): trained to completion, evaluated; the model is
   copied to RESULTS/models/cifar10.pt (what the book's train_or_load reuses) and the record and
   figures to RESULTS/cifar10/.
2. `cifar10_gpu` (paper scale: 32x32, T=1000, IMAGE_CONFIGS['cifar10']): trained for --minutes in
   bf16 + channels_last (resumable from runs/cifar10_gpu/checkpoint.pt), evaluated, 64 samples
   drawn; record, Figure 3, training curve and sample grid copied to RESULTS/cifar10_gpu/.

    PYTHONPATH=. python bench/cifar10_gpu.py --minutes 6                 # both, into results/
    PYTHONPATH=. python bench/cifar10_gpu.py --minutes 6 --results $OUT/results --skip-book

The same as `dpm train cifar10 --out runs/cifar10`, `dpm evaluate cifar10 --out runs/cifar10`,
`dpm train cifar10_gpu --out runs/cifar10_gpu --set amp=bf16 --set channels_last=true --set
max_minutes=6`, `dpm evaluate cifar10_gpu --out runs/cifar10_gpu` and `dpm sample cifar10_gpu
--out runs/cifar10_gpu -n 64`, once `dpm.cifar10` is in `dpm.cli.EXPERIMENT_MODULES` (this script
adds it if it is not). Checkpoints and weights of the paper-scale run stay in runs/ (not results/).
"""
import argparse, shutil, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import dpm.cli as cli

if 'dpm.cifar10' not in cli.EXPERIMENT_MODULES:
    cli.EXPERIMENT_MODULES = (*cli.EXPERIMENT_MODULES, 'dpm.cifar10')

KEEP = ('record.json', 'training.json', 'figure3.png', 'training.png', 'samples.png')


def timed(what, argv):
    t0 = time.time()
    cli.main(argv)
    print(f"== {what}: {time.time() - t0:.0f} s wall", flush=True)


def copy_record(run: Path, dest: Path):
    dest.mkdir(parents=True, exist_ok=True)
    for name in KEEP:
        if (run / name).exists(): shutil.copy2(run / name, dest / name)
    print(f"== copied {', '.join(n for n in KEEP if (run / n).exists())} to {dest}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--runs', default=str(ROOT / 'runs'), help='scratch: checkpoints and weights')
    p.add_argument('--results', default=str(ROOT / 'results'), help='where records are copied')
    p.add_argument('--minutes', type=float, default=6.0, help='paper-scale training time, this call')
    p.add_argument('--device', default='cuda')
    p.add_argument('--skip-book', action='store_true', help='only the paper-scale run')
    p.add_argument('--skip-gpu', action='store_true', help='only the book-scale run')
    p.add_argument('--compile', action='store_true', help='torch.compile the paper-scale network')
    p.add_argument('--samples', type=int, default=64)
    a = p.parse_args()
    runs, results, dev = Path(a.runs), Path(a.results), ['--device', a.device]
    if not a.skip_book:
        run = runs / 'cifar10'
        timed('train cifar10', ['train', 'cifar10', '--out', str(run), '--no-progress', *dev])
        timed('evaluate cifar10', ['evaluate', 'cifar10', '--out', str(run), *dev])
        (results / 'models').mkdir(parents=True, exist_ok=True)
        shutil.copy2(run / 'model.pt', results / 'models' / 'cifar10.pt')
        copy_record(run, results / 'cifar10')
    if not a.skip_gpu:
        run = runs / 'cifar10_gpu'
        sets = [f'max_minutes={a.minutes}', 'amp=bf16', 'channels_last=true'] \
            + (['compile=true'] if a.compile else [])
        timed('train cifar10_gpu', ['train', 'cifar10_gpu', '--out', str(run), '--no-progress', *dev,
                                    *[x for s in sets for x in ('--set', s)]])
        timed('evaluate cifar10_gpu', ['evaluate', 'cifar10_gpu', '--out', str(run), *dev])
        if a.samples:
            timed('sample cifar10_gpu', ['sample', 'cifar10_gpu', '--out', str(run), *dev,
                                         '-n', str(a.samples)])
        copy_record(run, results / 'cifar10_gpu')


if __name__ == '__main__':
    main()
