#!/usr/bin/env python
"""Training steps per second of each paper-scale image run alone on the device (one process).

Each run's own training step (`dpm.training.train`: bf16 autocast and channels-last on CUDA, the
experiment's batch) is timed for `--seconds` after a short warm-up, one run at a time; the rate of
the same runs all at once is what the campaign's concurrent training records (training.json: steps
and train_seconds), so the two can be set side by side. Writes JSON lines to stdout and `--out`.

    PYTHONPATH=. python bench/gpu_throughput.py --out /tmp/throughput.json          # on a GPU
    DPM_SMALL=1 PYTHONPATH=. python bench/gpu_throughput.py --device cpu --seconds 2  # dry run
"""
import argparse, json, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dpm.cli import get_experiment
from dpm.training import TrainConfig, train
from dpm.experiments import build, experiment_data, machine


def rate(name: str, seconds: float, device: str) -> dict:
    "Steps and training seconds of `name` for `seconds` of its own training loop on `device`."
    exp = get_experiment(name)
    sets = dict(eval_every=0, steps=10 ** 7, max_minutes=seconds / 60)
    if device != 'cpu': sets.update(amp='bf16', channels_last=True)
    cfg = exp.resolve(sets)
    train_data, _ = experiment_data(exp, cfg, 0)
    d, reverse = build(exp, cfg, 0, device)
    info = train(d, reverse, train_data, None, TrainConfig.from_dict(cfg), device=device,
                 progress=False, full_config=cfg)
    return dict(name=name, steps=info['steps'], seconds=info['train_seconds'],
                steps_per_second=info['steps'] / info['train_seconds'], batch_size=cfg['batch_size'])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('names', nargs='*', default=['mnist_gpu', 'dead_leaves_gpu', 'bark_gpu',
                                                 'cifar10_gpu'])
    p.add_argument('--device', default='cuda')
    p.add_argument('--seconds', type=float, default=8)
    p.add_argument('--warmup', type=float, default=2)
    p.add_argument('--out', default='')
    a = p.parse_args(argv)
    rows = []
    for name in a.names:
        rate(name, a.warmup, a.device)                  # compile, autotune, allocate: not timed
        rows.append(rate(name, a.seconds, a.device))
        print(json.dumps(rows[-1]), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(dict(alone=rows, machine=machine(), device=a.device,
                                               time=time.strftime('%Y-%m-%d %H:%M:%S')), indent=2))


if __name__ == '__main__':
    main()
