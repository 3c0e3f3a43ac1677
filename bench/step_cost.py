#!/usr/bin/env python
"""The cost of one training step of each paper-scale run, counted on a CPU, against an H200's peak.

For each run (the experiment's paper-scale configuration, its batch, its network) one step of
`dpm.training` (draw, forward, backward, Adam) is run once untimed, so that Adam has its moments,
and once counted:

  FLOPs   `torch.utils.flop_counter.FlopCounterMode`: the matrix products and convolutions of the
          forward and the backward (2 per multiply-add); elementwise work is not counted.
  bytes   a dispatch mode that adds, for every ATen operation of the step, the bytes of the
          distinct tensors it reads and writes (an in-place operation's tensor once; views and
          other metadata operations not at all): the memory traffic of an unfused execution, one
          kernel an operation, as the eager step and its CUDA graph run it. The step runs under
          CPU autocast in bfloat16, as the GPU runs train (amp='bf16'), so matrix products and
          convolutions read bf16 operands.

With the measured GPU step times (the fastest step of each run in results/gpu_throughput.json,
else the figure of bench/step_speed.md) it prints what fraction of the device's peak each step
would reach: FLOPs over time against the dense bf16 Tensor Core peak, bytes over time against the
memory bandwidth. Peaks: NVIDIA H200 SXM datasheet (the device reports itself as 'NVIDIA H200',
not 'H200 NVL'): BF16 Tensor Core 1,979 TFLOPS with sparsity, 989.5 dense; FP32 67 TFLOPS; HBM3e
4.8 TB/s.

    PYTHONPATH=. python bench/step_cost.py --out results/step_cost.json   # the table (minutes)
    PYTHONPATH=. python bench/step_cost.py mnist_gpu --out /tmp/cost.json
"""
import argparse, json, os, sys, time
from pathlib import Path

os.environ['DPM_SMALL'] = '0'                        # the paper-scale configurations
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import torch
from torch.utils.flop_counter import FlopCounterMode
from torch.utils._python_dispatch import TorchDispatchMode
from dpm.cli import get_experiment
from dpm.experiments import build, machine
from dpm.training import TrainConfig, Model, _objective, _optimizer, _param_groups, _draw

RUNS = ('mnist_gpu', 'dead_leaves_gpu', 'bark_gpu', 'cifar10_gpu')
BF16_DENSE_TFLOPS, FP32_TFLOPS, HBM_TBPS = 989.5, 67.0, 4.8      # H200 SXM datasheet
# steps per second on the H200 of the step each run trains with: the fastest variant of
# results/gpu_throughput.json where it has the run, else the figure of bench/step_speed.md
MEASURED = dict(bark_gpu=(50.2, 'graph, fast sum, channels-last (bench/step_speed.md, first run)'),
                cifar10_gpu=(48.4, 'eager, literal sum (bench/step_speed.md; after: not measured)'))


def measured(name: str) -> tuple:
    "(steps per second on the H200, which step) for run `name`."
    try: rows = json.loads((ROOT / 'results' / 'gpu_throughput.json').read_text())['rows']
    except (OSError, ValueError, KeyError): rows = []
    own = [r for r in rows if r.get('name') == name]
    if own:
        best = max(own, key=lambda r: r['steps_per_second'])
        return best['steps_per_second'], f"{best['variant']} (results/gpu_throughput.json)"
    return MEASURED[name]


class ByteCount(TorchDispatchMode):
    "Bytes of the tensors the ATen operations inside read and write, views excepted (unfused)."
    def __init__(self):
        super().__init__(); self.bytes, self.ops = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if torch.Tag.view_copy in func.tags or func.is_view or _metadata(func): return out
        seen = set()
        def add(x):
            if isinstance(x, torch.Tensor) and id(x) not in seen:
                seen.add(id(x)); self.bytes += x.numel() * x.element_size()
        for x in torch.utils._pytree.tree_leaves((args, kwargs, out)): add(x)
        self.ops += 1
        return out


def _metadata(func) -> bool:
    "Operations that move no data: shapes, strides, detaching, empty allocations."
    name = func.__name__.split('.')[0]
    return name in ('detach', 'view', 'alias', 'empty', 'empty_like', 'empty_strided', 'lift_fresh',
                    'set_', 'resize_', 'as_strided', '_reshape_alias', 'unsqueeze', 'squeeze',
                    't', 'transpose', 'permute', 'expand', 'slice', 'select', 'split')


def cost(name: str) -> dict:
    "FLOPs and bytes of one training step of run `name` (bf16 autocast, its batch), on a CPU."
    exp = get_experiment(name)
    cfg = exp.resolve(); cfg['seed'] = 0
    tc = TrainConfig.from_dict({**cfg, 'amp': 'bf16', 'channels_last': False, 'compile': False})
    cpu = torch.device('cpu')
    d, reverse = build(exp, cfg, 0, cpu)
    model = Model(d, reverse)
    opt = _optimizer(tc, _param_groups(model, tc))
    objective = _objective(model, reverse, tc, cpu, 1)
    shape = tuple(getattr(reverse, 'event_shape', None) or cfg.get('shape'))
    data = torch.rand(tc.batch_size, *shape)
    idx = torch.arange(tc.batch_size)
    def step():
        batch = _draw(d, data, idx, tc, (0, tc.batch_size), torch.contiguous_format)
        loss = -objective(*batch).mean()
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    t0 = time.perf_counter(); step(); untimed = time.perf_counter() - t0
    flops, traffic = FlopCounterMode(display=False), ByteCount()
    with flops, traffic: step()
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    rate, how = measured(name)
    total = flops.get_total_flops()
    by_op = {str(k): v for k, v in flops.get_flop_counts().get('Global', {}).items()}
    return dict(name=name, batch=tc.batch_size, params=n_params, flops=total, bytes=traffic.bytes,
                ops=traffic.ops, flops_by_op=by_op, intensity=total / traffic.bytes,
                gpu_steps_per_second=rate, gpu_step=how, cpu_step_seconds=untimed,
                bf16_peak_fraction=total * rate / (BF16_DENSE_TFLOPS * 1e12),
                fp32_peak_fraction=total * rate / (FP32_TFLOPS * 1e12),
                bandwidth_fraction=traffic.bytes * rate / (HBM_TBPS * 1e12))


def table(rows) -> str:
    "The Markdown table of bench/step_speed.md."
    out = ["| run | batch | parameters | GFLOP/step | GB moved/step | FLOP/byte | GPU steps/s "
           "| TFLOPS | of bf16 peak | TB/s | of bandwidth |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rate = r['gpu_steps_per_second']
        out.append(f"| {r['name']} | {r['batch']} | {r['params'] / 1e6:.2f} M | "
                   f"{r['flops'] / 1e9:.1f} | {r['bytes'] / 1e9:.2f} | {r['intensity']:.0f} | "
                   f"{rate:.1f} | {r['flops'] * rate / 1e12:.1f} | "
                   f"{100 * r['bf16_peak_fraction']:.1f} % | {r['bytes'] * rate / 1e12:.2f} | "
                   f"{100 * r['bandwidth_fraction']:.0f} % |")
    return '\n'.join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('names', nargs='*', default=list(RUNS))
    ap.add_argument('--out', help='write the rows as JSON here too')
    ap.add_argument('--threads', type=int, default=torch.get_num_threads())
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    rows = []
    for n in a.names:
        t = time.perf_counter(); rows.append(cost(n))
        print(f"{n}: counted in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    print(table(rows))
    print(f"\npeaks: bf16 dense Tensor Core {BF16_DENSE_TFLOPS} TFLOPS, FP32 {FP32_TFLOPS} TFLOPS, "
          f"HBM {HBM_TBPS} TB/s (NVIDIA H200 SXM); machine: {machine().get('processor')}, "
          f"torch {torch.__version__}")
    if a.out:
        Path(a.out).write_text(json.dumps(dict(rows=rows, machine=machine()), indent=1) + '\n')


if __name__ == '__main__':
    main()
