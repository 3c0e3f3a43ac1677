"""Where dpm's training step spends the time that the plain PyTorch twin does not (bench_images.py).

    PYTHONPATH=. python bench/profile_step.py --arch cifar10 --batch 128 --modes fp32,bf16 \
        --out p.txt

For each mode, both implementations run `--warmup` steps, then `--steps` steps under torch.profiler.
It prints, per implementation: wall milliseconds per step, the device's busy milliseconds per step
(kernels summed), kernels launched per step, and the operators that take the most device time.
A step whose wall time exceeds its device time is bound by the host (Python and launches).
On a CPU (--device cpu) it is a dry run: operators by CPU time.
"""
import argparse, sys, time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_images import setup                          # noqa: E402 (this folder's bench)


def profile_one(arch, impl, batch, mode, device, steps, warmup):
    "Wall and device time per step of one implementation, and its profiler table."
    step, _ = setup(arch, impl, batch, mode, device, seed=0)
    cuda = device.type == 'cuda'
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup): step()
    sync()
    acts = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(steps): step()
        sync()
        wall = (time.perf_counter() - t0) / steps
    events = prof.key_averages()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in kernels) / 1e3 / steps       # microseconds -> ms
    table = events.table(sort_by=f"self_{'device' if cuda else 'cpu'}_time_total", row_limit=18,
                         max_name_column_width=60)
    return dict(wall_ms=wall * 1e3, busy_ms=busy, kernels=len(kernels) / steps), table


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--arch', default='cifar10')
    p.add_argument('--batch', type=int, default=128)
    p.add_argument('--modes', default='fp32,bf16')
    p.add_argument('--steps', type=int, default=20)
    p.add_argument('--warmup', type=int, default=10)
    p.add_argument('--out', default=None, help='also write the report here')
    p.add_argument('--device', default='cuda', help="'cuda', or 'cpu' for a dry run")
    a = p.parse_args()
    device = torch.device(a.device)
    if device.type == 'cuda': torch.backends.cudnn.benchmark = True
    name = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'
    lines = [f'{name}, torch {torch.__version__}; {a.arch}, '
             f'batch {a.batch}, {a.steps} profiled steps after {a.warmup}']
    for mode in a.modes.split(','):
        for impl in ('plain', 'dpm'):
            s, table = profile_one(a.arch, impl, a.batch, mode, device, a.steps, a.warmup)
            lines += [f'\n== {mode} {impl}: wall {s["wall_ms"]:.2f} ms/step, device busy '
                      f'{s["busy_ms"]:.2f} ms/step, {s["kernels"]:.0f} kernels/step', table]
            print(lines[-2], flush=True)
    if a.out: Path(a.out).write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines[1:]))


if __name__ == '__main__':
    main()
