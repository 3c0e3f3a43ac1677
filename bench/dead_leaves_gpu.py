#!/usr/bin/env python
"""Paper-scale dead leaves on one GPU: train `dead_leaves_gpu` (64x64 images, T=1000, the paper's
multi-scale convolutional network size, reference-code variant) for --minutes in bf16, then
evaluate it: K on held-out images with every t summed, the full-covariance Gaussian baseline and
Figure 4, all in OUT/record.json.

Resumable: running it again continues from OUT/checkpoint.pt for --minutes more.

    PYTHONPATH=. python bench/dead_leaves_gpu.py --minutes 6          # train 6 minutes, evaluate
    PYTHONPATH=. python bench/dead_leaves_gpu.py --minutes 6          # 6 more minutes, evaluate again
    PYTHONPATH=. python bench/dead_leaves_gpu.py --evaluate-only

The same as `dpm train dead_leaves_gpu --out OUT --set amp=bf16 --set max_minutes=6 --set
channels_last=true` and `dpm evaluate dead_leaves_gpu --out OUT`, once `dpm.dead_leaves` is listed in
`dpm.cli.EXPERIMENT_MODULES` (this script adds it if it is not).
"""
import argparse, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import dpm.cli as cli

if 'dpm.dead_leaves' not in cli.EXPERIMENT_MODULES:
    cli.EXPERIMENT_MODULES = (*cli.EXPERIMENT_MODULES, 'dpm.dead_leaves')


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--out', default=str(ROOT / 'results' / 'dead_leaves_gpu'))
    p.add_argument('--minutes', type=float, default=6.0, help='training wall time of this call')
    p.add_argument('--experiment', default='dead_leaves_gpu')
    p.add_argument('--device', default=None)
    p.add_argument('--no-bf16', action='store_true', help='train in float32')
    p.add_argument('--no-channels-last', action='store_true')
    p.add_argument('--compile', action='store_true', help='torch.compile the network (slow start)')
    p.add_argument('--evaluate-only', action='store_true')
    p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE', help='more overrides')
    a = p.parse_args()
    dev = ['--device', a.device] if a.device else []
    if not a.evaluate_only:
        sets = [f'max_minutes={a.minutes}'] + ([] if a.no_bf16 else ['amp=bf16']) \
            + ([] if a.no_channels_last else ['channels_last=true']) + (['compile=true'] if a.compile else []) \
            + a.set
        t0 = time.time()
        cli.main(['train', a.experiment, '--out', a.out, '--no-progress', *dev,
                  *[x for s in sets for x in ('--set', s)]])
        print(f"train call: {time.time() - t0:.0f} s wall", flush=True)
    t0 = time.time()
    cli.main(['evaluate', a.experiment, '--out', a.out, *dev])
    print(f"evaluate call: {time.time() - t0:.0f} s wall", flush=True)


if __name__ == '__main__':
    main()
