#!/usr/bin/env python
"""Each paper-scale image run's own training step alone on the device, before and after the faster
step: steps per second, kernels per step, and the device's busy time per step against the wall time.

Variants of the step (`dpm.training.train`, bf16 autocast, the experiment's batch):
  before      as the campaign trained until then: eager, channels-last, the literal multi-scale sum
              (eq-net-msconv: avg_pool2d and interpolate), a checkpoint every 500 steps;
  eager       eager, channels-last, the sum of eq-net-msconv-fast (pooling by reshape and mean,
              upsampling fused with the sum), a checkpoint a minute (none in the timed window);
  eager_nchw  the same without channels-last (convolutional runs only);
  after       as `eager`, the step replayed as one CUDA graph (cuda_graph=true);
  after_nchw  the same without channels-last (convolutional runs only).
Each variant first runs 30 steps untimed (library start-up, cuDNN's autotuning of its layout).
Steps per second come from two timed runs (the difference of their steps over the difference of
their training seconds, so a run's start and its graph's capture cancel); kernels and busy time per
step from two profiled runs of different lengths, the same way (the profiler lengthens kernels:
compare busy times with each other, not with the wall). Writes JSON to stdout and `--out`.

    PYTHONPATH=. python bench/gpu_throughput.py --out /tmp/throughput.json          # on a GPU
    DPM_SMALL=1 PYTHONPATH=. python bench/gpu_throughput.py --device cpu --seconds 1 # dry run
"""
import argparse, json, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import torch
from torch.profiler import ProfilerActivity, profile
from dpm.cli import get_experiment
from dpm.training import TrainConfig, train
from dpm.experiments import build, experiment_data, machine
from dpm.image_network import MultiScaleConv

FAST_SUM = MultiScaleConv._sum_scales
VARIANTS = dict(before=dict(cuda_graph=False, channels_last=True, literal=True, every=500),
                eager=dict(cuda_graph=False, channels_last=True, literal=False, every=None),
                eager_nchw=dict(cuda_graph=False, channels_last=False, literal=False, every=None),
                after=dict(cuda_graph=True, channels_last=True, literal=False, every=None),
                after_nchw=dict(cuda_graph=True, channels_last=False, literal=False, every=None))


def _train(exp, cfg, data, device, variant, **sets):
    "One run of `name`'s step in `variant`; its training record."
    v = VARIANTS[variant]
    gpu = device != 'cpu'
    sets = dict(dict(eval_every=0, steps=10 ** 7), **sets)
    if gpu: sets.update(amp='bf16', channels_last=v['channels_last'], cuda_graph=v['cuda_graph'])
    c = {**cfg, **sets}
    c.update(checkpoint_every=v['every'] or 10 ** 9, checkpoint_minutes=None if v['every'] else 1)
    MultiScaleConv._sum_scales = MultiScaleConv._sum_scales_direct if v['literal'] else FAST_SUM
    try:
        d, reverse = build(exp, c, 0, device)
        with tempfile.TemporaryDirectory() as work:
            return train(d, reverse, data, None, TrainConfig.from_dict(c), device=device,
                         progress=False, full_config=c, checkpoint=Path(work) / 'checkpoint.pt')
    finally: MultiScaleConv._sum_scales = FAST_SUM


def rate(exp, cfg, data, device, variant, seconds: float) -> float:
    "Steps per second of the loop alone: two runs, their difference (after 30 untimed steps)."
    _train(exp, cfg, data, device, variant, steps=30)
    a = _train(exp, cfg, data, device, variant, max_minutes=seconds / 4 / 60)
    b = _train(exp, cfg, data, device, variant, max_minutes=seconds / 60)
    return (b['steps'] - a['steps']) / max(b['train_seconds'] - a['train_seconds'], 1e-9)


def kernels(exp, cfg, data, device, variant, n1: int = 10, n2: int = 40) -> dict:
    "Kernels and device-busy milliseconds per step: two profiled runs of n1 and n2 steps."
    cuda = device != 'cpu'
    counts = []
    for n in (n1, n2):
        with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
            _train(exp, cfg, data, device, variant, steps=n)
            if cuda: torch.cuda.synchronize()
        ks = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        counts.append((len(ks), sum(e.device_time for e in ks) / 1e3))
    (k1, b1), (k2, b2) = counts
    return dict(kernels_per_step=(k2 - k1) / (n2 - n1), busy_ms_per_step=(b2 - b1) / (n2 - n1))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('names', nargs='*', default=['mnist_gpu', 'dead_leaves_gpu', 'bark_gpu',
                                                 'cifar10_gpu'])
    p.add_argument('--device', default='cuda')
    p.add_argument('--seconds', type=float, default=4)
    p.add_argument('--variants', default='before,eager,eager_nchw,after,after_nchw')
    p.add_argument('--no-profile', action='store_true')
    p.add_argument('--out', default='')
    a = p.parse_args(argv)
    if a.device != 'cpu': torch.backends.cudnn.benchmark = True
    rows = []
    for name in a.names:
        exp = get_experiment(name)
        cfg = exp.resolve({})
        data = experiment_data(exp, cfg, 0)[0]
        for variant in a.variants.split(','):
            if variant.endswith('_nchw') and cfg.get('n_scales') is None: continue  # dense: no convs
            t0 = time.perf_counter()
            row = dict(name=name, variant=variant, batch_size=cfg['batch_size'],
                       steps_per_second=rate(exp, cfg, data, a.device, variant, a.seconds))
            row['wall_ms_per_step'] = 1e3 / row['steps_per_second']
            if not a.no_profile: row.update(kernels(exp, cfg, data, a.device, variant))
            row['bench_seconds'] = time.perf_counter() - t0
            rows.append(row); print(json.dumps(row), flush=True)
            if a.out:                                   # after every row: a cut run keeps them
                Path(a.out).write_text(json.dumps(dict(
                    rows=rows, machine=machine(), device=a.device,
                    time=time.strftime('%Y-%m-%d %H:%M:%S')), indent=2))
    print(table(rows))


def table(rows) -> str:
    "Before and after, a line per run and variant: steps/s, its ratio to before, kernels, busy."
    lines = ['| run | step | steps/s | × before | kernels/step | device busy / wall (ms) |',
             '|---|---|---:|---:|---:|---:|']
    before = {r['name']: r['steps_per_second'] for r in rows if r['variant'] == 'before'}
    for r in rows:
        ratio = r['steps_per_second'] / before[r['name']] if r['name'] in before else float('nan')
        busy = (f"{r['busy_ms_per_step']:.2f} / {r['wall_ms_per_step']:.2f}"
                if 'busy_ms_per_step' in r else f"– / {r['wall_ms_per_step']:.2f}")
        lines.append(f"| {r['name']} | {r['variant']} | {r['steps_per_second']:.1f} | {ratio:.2f} | "
                     f"{r.get('kernels_per_step', float('nan')):.0f} | {busy} |")
    return '\n'.join(lines)


if __name__ == '__main__':
    main()
