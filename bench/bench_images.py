#!/usr/bin/env python
"""Training throughput (images/s) of the dpm image model against a plain PyTorch implementation.

The dpm step is `dpm.training`'s own: the minibatch (`_minibatch`: examples, stratified steps, noise),
then `_step` (the one-step bound estimate `d.bound_estimate` (eq-k-estimator) under the objective
that `train` builds, backward, the fused Adam step that skips a failed step on the device, the
previous step's loss and checks read while this one runs); no weight average (the plain step has
none). The plain step reads nothing. The plain implementation below is written without any dpm code
(its own multi-scale convolution, 1x1 layers, temporal bumps, kernel and one-step Gaussian KL loss)
and has the same architecture: its parameters are copied from the dpm model and the two must give
the same kernel (checked first). dpm autocasts only the network (as `train` does); the plain step
runs whole under autocast. On CUDA each entry also counts the host synchronisations per step that
`torch.cuda.set_sync_debug_mode` reports for each implementation.

Two architectures (App. D.2; `dpm.image_network.IMAGE_CONFIGS`): the CIFAR-10 size (3x32x32, four
multi-scale layers of 100 channels, 4 scales, dense pathway of 1,000 units) and the 64x64 grey
convolution-only network of the dead-leaves experiment. Modes: fp32; bf16 (autocast); bf16_cl
(bf16 + channels_last); bf16_cl_compile (+ torch.compile of the network; on CUDA it runs first,
being the mode of the anchors). Each measurement alternates the two implementations for a few rounds
and keeps each one's best round. Results are merged into results/bench_images.json (one entry per
device, architecture, batch and mode), written after every measurement; measurements that would
start after `--budget` seconds (CUDA default 170) are skipped, so the GPU part stays under 3 minutes.

    python bench/bench_images.py --device cpu                    # tiny CPU run (< 1 min on 2 cores)
    PYTHONPATH=. python bench/bench_images.py --device cuda      # GPU: all modes, batch 128 and 512
    python bench/bench_images.py --device cuda --archs cifar10 --batch 512 --modes bf16_cl_compile
"""
import argparse, contextlib, datetime, json, math, os, platform, sys, time
from pathlib import Path

import torch
from torch import nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODES = ('fp32', 'bf16', 'bf16_cl', 'bf16_cl_compile')
ARCHS = ('cifar10', 'dead_leaves')
DEFAULTS = {     # device type -> batches per architecture, steps, warm-up steps, modes
    'cuda': dict(batch={'cifar10': [128, 512], 'dead_leaves': [128]}, steps=20, warmup=3, rounds=2,
                 modes=('bf16_cl_compile', 'bf16_cl', 'bf16', 'fp32'), budget=170),
    'cpu': dict(batch={'cifar10': [4], 'dead_leaves': [2]}, steps=2, warmup=0, rounds=3,
                modes=('fp32',), budget=600),
}
T = 1000
ANCHORS = {'cifar10': {128: 15000, 512: 23000}, 'dead_leaves': {128: 4300}}   # plain, H200, bf16+cl+compile


# ------------------------------------------------------------------ plain PyTorch, no dpm code
class PlainMultiScale(nn.Module):
    "softplus(sum_s upsample(conv_s(meanpool_s(x)))), nearest upsampling."
    def __init__(self, c_in, c_out, k, n_scales):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(c_in, c_out, k, padding=k // 2) for _ in range(n_scales))

    def forward(self, x):
        out = 0
        for s in reversed(range(len(self.convs))):
            out = out + self.convs[s](F.avg_pool2d(x, 2 ** s) if s else x)
            if s: out = F.interpolate(out, scale_factor=2, mode='nearest')
        return F.softplus(out)


class PlainReverse(nn.Module):
    "Same layers, in the same order, as dpm.image_network.ImageReverse(variant='paper')."
    def __init__(self, betas, image_shape, pathway='conv', n_scales=4, conv_channels=64,
                 conv_layers=4, kernel_size=3, dense_hidden=1000, dense_layers=2, dense_channels=5,
                 hidden_1x1=64, layers_1x1=2, n_bumps=10):
        super().__init__()
        C, H, W = image_shape
        self.shape, self.J, self.dc = image_shape, n_bumps, dense_channels
        self.use_conv, self.use_dense = pathway in ('conv', 'both'), pathway in ('dense', 'both')
        n = 0
        if self.use_conv:
            ch = [C] + [conv_channels] * conv_layers
            self.conv = nn.Sequential(*[PlainMultiScale(a, b, kernel_size, n_scales)
                                        for a, b in zip(ch[:-1], ch[1:])])
            n += conv_channels
        if self.use_dense:
            sizes = [C * H * W] + [dense_hidden] * (dense_layers - 1) + [dense_channels * H * W]
            self.dense = nn.Sequential(*[m for a, b in zip(sizes[:-1], sizes[1:])
                                         for m in (nn.Linear(a, b), nn.Tanh())])
            n += dense_channels
        layers = []
        for _ in range(layers_1x1): layers += [nn.Conv2d(n, hidden_1x1, 1), nn.Tanh()]; n = hidden_1x1
        self.mlp_1x1 = nn.Sequential(*layers)
        self.readout = nn.Conv2d(n, 2 * C * n_bumps, 1)
        t = torch.arange(1, T + 1, dtype=torch.float64)
        centres = torch.linspace(1, T, n_bumps, dtype=torch.float64)
        g = torch.softmax(-0.5 * ((t[:, None] - centres) / (centres[1] - centres[0])) ** 2, 1)
        self.register_buffer('g', g.float())
        self.register_buffer('logit_beta', torch.logit(betas).float())

    def forward(self, x, t):
        "(mean, var) of the reverse kernel, float32."
        B, (C, H, W) = x.shape[0], self.shape
        parts = []
        if self.use_conv: parts.append(self.conv(x))
        if self.use_dense:
            h = self.dense(x.reshape(B, -1)).reshape(B, self.dc, H, W)
            if x.is_contiguous(memory_format=torch.channels_last):
                h = h.contiguous(memory_format=torch.channels_last)
            parts.append(h)
        y = self.readout(self.mlp_1x1(torch.cat(parts, 1) if len(parts) > 1 else parts[0]))
        z = torch.einsum('bkcjhw,bj->bkchw', y.reshape(B, 2, C, self.J, H, W),
                         self.g[t - 1].to(y.dtype)).float()
        var = torch.sigmoid(z[:, 1] + self.logit_beta[t - 1].view(-1, 1, 1, 1))
        return (x - z[:, 0]) * (1 - var) + z[:, 0], var


class PlainLoss:
    "Minus the one-step estimate of K (up to constants): (T-1) * KL(q(x_{t-1}|x_t,x_0) || p)."
    def __init__(self, betas, device):
        b = betas.double()
        ab = torch.cumprod(1 - b, 0)
        ab_prev = torch.cat([ab.new_ones(1), ab[:-1]])
        f = lambda v: v.float().to(device)
        self.sqrt_ab, self.sqrt_1m_ab = f(ab.sqrt()), f((1 - ab).sqrt())
        self.c0, self.ct = f(ab_prev.sqrt() * b / (1 - ab)), f((1 - b).sqrt() * (1 - ab_prev) / (1 - ab))
        self.var, self.log_var = f((1 - ab_prev) * b / (1 - ab)), f(((1 - ab_prev) * b / (1 - ab)).log())

    def __call__(self, net, x0, t):
        v = lambda a: a[t - 1].view(-1, 1, 1, 1)            # per-example coefficient
        xt = v(self.sqrt_ab) * x0 + v(self.sqrt_1m_ab) * torch.randn_like(x0)
        mq, vq, lvq = v(self.c0) * x0 + v(self.ct) * xt, v(self.var), v(self.log_var)
        mp, vp = net(xt, t)
        kl = 0.5 * (vp.log() - lvq + (vq + (mq - mp) ** 2) / vp - 1).sum((1, 2, 3))
        return (T - 1) * kl.mean()


def plain_steps(B, device):
    u = torch.rand((), device=device)
    return 2 + ((T - 1) * (torch.arange(B, device=device) + u) / B).floor().long().clamp(max=T - 2)


# ------------------------------------------------------------------ the dpm side
def dpm_model(arch, device):
    from dpm.diffusion import GaussianDiffusion, GaussianSchedule
    from dpm.image_network import ImageReverse, IMAGE_CONFIGS
    d = GaussianDiffusion(GaussianSchedule(T, learn=False)).to(device)
    return d, ImageReverse(d, **IMAGE_CONFIGS[arch]).to(device)


def plain_model(arch, d, device):
    from dpm.image_network import IMAGE_CONFIGS           # the sizes only
    return PlainReverse(d.betas.detach().cpu(), **IMAGE_CONFIGS[arch]).to(device)


def copy_and_check(arch, device):
    "Copy the dpm model's parameters into the plain one; their kernels must agree."
    d, rev = dpm_model(arch, device)
    plain = plain_model(arch, d, device)
    pd, pp = list(rev.parameters()), list(plain.parameters())
    assert [p.shape for p in pd] == [p.shape for p in pp], 'the two architectures differ'
    with torch.no_grad():
        for a, b in zip(pp, pd): a.copy_(b)
        x = torch.randn(2, *rev.event_shape, device=device)
        t = torch.tensor([2, T // 2], device=device)
        (m1, v1), (m2, v2) = rev(x, t), plain(x, t)
    err = max((m1 - m2).abs().max().item(), ((v1 / v2).log().abs().max().item()))
    assert err < 1e-4, f'plain and dpm kernels differ by {err}'
    return d, rev, plain, sum(p.numel() for p in pd), err


def setup(arch, impl, batch, mode, device, seed):
    "A training step of one implementation, ready to run: returns (step, n_params)."
    torch.manual_seed(seed)
    d, rev, plain, n_params, _ = copy_and_check(arch, device)
    bf16, fmt = 'bf16' in mode, torch.channels_last if 'cl' in mode else torch.contiguous_format
    pool = torch.randn(4 * batch, *rev.event_shape, device=device).contiguous(memory_format=fmt)
    if impl == 'dpm': return dpm_step(d, rev, pool, batch, mode, device, seed), n_params
    net = plain.to(memory_format=fmt)
    call = torch.compile(net) if 'compile' in mode else net
    opt = torch.optim.Adam(net.parameters(), lr=1e-4, fused=True)
    loss_fn = PlainLoss(d.betas.detach(), device)

    def step():
        x0 = pool[torch.randint(len(pool), (batch,), device=device)]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(call, x0, plain_steps(batch, device))
        opt.zero_grad(set_to_none=True); loss.backward()
        opt.step()
        return loss
    return step, n_params


def dpm_step(d, rev, pool, batch, mode, device, seed):
    "dpm.training's step, as `train` runs it (without a weight average)."
    from dpm import training as tr
    cfg = tr.TrainConfig(steps=10 ** 9, batch_size=batch, lr=1e-4, eval_every=0, seed=seed,
                         amp='bf16' if 'bf16' in mode else None, channels_last='cl' in mode,
                         compile='compile' in mode)
    model = tr.Model(d, rev).to(device)
    data, _, fmt = tr._training_data(d, model, pool, None, cfg, device)
    state = tr._start(model, cfg, {}, device, None)
    objective = tr._objective(model, rev, cfg, device, 1)
    t_start = time.perf_counter()

    def step():
        tr._step(state, objective, tr._minibatch(d, data, cfg, state.gen, (0, batch), fmt, device),
                 cfg, t_start)
        return state.pending[1][0]           # the loss, on its way to the host (read after a sync)
    return step


def syncs_per_step(step, device, n=5):
    "Host synchronisations per step, as torch.cuda.set_sync_debug_mode('warn') reports them."
    if device.type != 'cuda': return None
    import warnings
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        torch.cuda.set_sync_debug_mode('warn')
        try:
            for _ in range(n): step()
        finally: torch.cuda.set_sync_debug_mode('default')
    torch.cuda.synchronize()
    return sum('synchroniz' in str(w.message) for w in caught) / n


def measure(arch, batch, mode, device, steps, warmup, rounds, seed):
    "Images/s of both implementations: best of `rounds` alternating rounds of `steps` steps each."
    sync = torch.cuda.synchronize if device.type == 'cuda' else (lambda: None)
    res = {}
    if 'compile' in mode: torch._dynamo.reset()                 # a fresh compilation cache
    for impl in ('plain', 'dpm'):
        base = 0
        if device.type == 'cuda':
            torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()             # the other implementation, if set up
        step, n_params = setup(arch, impl, batch, mode, device, seed)
        t0 = time.perf_counter(); step(); sync()
        first = time.perf_counter() - t0                        # includes compilation
        for _ in range(warmup): step()
        sync()
        syncs = syncs_per_step(step, device)
        peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20 if device.type == 'cuda' else None
        res[impl] = dict(step=step, first_step_seconds=first, peak_memory_mb=peak, rounds=[],
                         host_syncs_per_step=syncs)
    for _ in range(rounds):                                     # alternate: load drifts hit both
        for impl in ('plain', 'dpm'):
            step = res[impl]['step']
            sync(); t0 = time.perf_counter()
            for _ in range(steps): loss = step()
            sync(); res[impl]['rounds'].append(steps * batch / (time.perf_counter() - t0))
            if not math.isfinite(loss.item()): raise FloatingPointError(f'{impl} loss {loss.item()}')
    for r in res.values():
        del r['step']; r['images_per_s'] = max(r['rounds'])
    if device.type == 'cpu':
        import resource
        for r in res.values(): r['peak_memory_mb'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return res


def machine(device):
    "experiments.machine() (where a number was measured) and the device the bench ran on."
    from dpm.experiments import machine as where
    info = dict(where(), device=str(device))
    if device.type == 'cuda':
        info.update(device_name=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version())
    else: info['device_name'] = info['processor']
    return info


def save(path, entries, info):
    results = json.loads(path.read_text()) if path.exists() else {}
    runs = {(r['device_type'], r['arch'], r['batch'], r['mode']): r for r in results.get('runs', [])}
    runs.update({(r['device_type'], r['arch'], r['batch'], r['mode']): r for r in entries})
    results['runs'] = sorted(runs.values(), key=lambda r: (r['device_type'], r['arch'], r['batch'],
                                                           MODES.index(r['mode'])))
    results.setdefault('machines', {})[info['device'].split(':')[0]] = info
    results['target'] = 'dpm images/s >= 0.9 x plain'
    results['anchors_plain_images_per_s_H200_bf16_cl_compile'] = ANCHORS
    results['written'] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix('.tmp'); tmp.write_text(json.dumps(results, indent=2) + '\n')
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--device', default='auto', help="'cpu', 'cuda' or 'auto' (cuda if available)")
    p.add_argument('--archs', default=','.join(ARCHS), help=f'comma-separated, from {ARCHS}')
    p.add_argument('--modes', default=None, help=f'comma-separated, from {MODES} (default: cpu fp32)')
    p.add_argument('--batch', default=None, help='comma-separated batch sizes for every architecture')
    p.add_argument('--steps', type=int, default=None, help='timed steps per measurement')
    p.add_argument('--warmup', type=int, default=None, help='untimed steps after the first')
    p.add_argument('--rounds', type=int, default=None, help='alternating timed rounds; best is kept')
    p.add_argument('--budget', type=float, default=None,
                   help='seconds; later measurements are skipped (default: cuda 170, cpu 600)')
    p.add_argument('--threads', type=int, default=1,
                   help='torch CPU threads (1: steadiest on a shared machine)')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default=str(ROOT / 'results' / 'bench_images.json'))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    device = torch.device('cuda' if a.device == 'auto' and torch.cuda.is_available() else
                          ('cpu' if a.device == 'auto' else a.device))
    if device.type == 'cuda': torch.backends.cudnn.benchmark = True
    dflt = DEFAULTS['cuda' if device.type == 'cuda' else 'cpu']
    modes = a.modes.split(',') if a.modes else list(dflt['modes'])
    archs = a.archs.split(',')
    for m in modes:
        if m not in MODES: sys.exit(f'unknown mode {m!r}; known: {", ".join(MODES)}')
    for x in archs:
        if x not in ARCHS: sys.exit(f'unknown architecture {x!r}; known: {", ".join(ARCHS)}')
    steps = a.steps or dflt['steps']
    warmup = dflt['warmup'] if a.warmup is None else a.warmup
    rounds = a.rounds or dflt['rounds']
    budget = a.budget or dflt['budget']
    info, path, entries, t_start = machine(device), Path(a.out), [], time.perf_counter()
    print(f"device {info['device_name']}, torch {torch.__version__}; best of {rounds} rounds of "
          f"{steps} timed steps, after the first step and {warmup} warm-up steps")
    n_params = {}
    for arch in archs:
        *_, n_params[arch], err = copy_and_check(arch, torch.device('cpu'))
        print(f'{arch}: {n_params[arch]:,} parameters (dpm and plain); kernels agree to {err:.1e}')
    plan = [(mode, arch, batch) for mode in modes for arch in archs
            for batch in ([int(b) for b in a.batch.split(',')] if a.batch else dflt['batch'][arch])]
    for mode, arch, batch in plan:
        left = budget - (time.perf_counter() - t_start)
        entry = dict(device_type=device.type, device_name=info['device_name'], arch=arch, batch=batch,
                     mode=mode, params=n_params[arch], steps=steps, warmup=warmup, rounds=rounds,
                     seed=a.seed, threads=a.threads, anchor_plain_images_per_s=ANCHORS[arch].get(batch))
        if left < (60 if 'compile' in mode else 10):
            print(f"  {arch:12s} batch {batch:4d} {mode:16s} skipped: {left:.0f} s of the budget left")
            continue
        try:
            r = measure(arch, batch, mode, device, steps, warmup, rounds, a.seed)
        except Exception as e:                       # e.g. a compiler or out-of-memory error
            entry['error'] = f'{type(e).__name__}: {str(e)[:300]}'
            print(f"  {arch:12s} batch {batch:4d} {mode:16s} failed: {entry['error']}", flush=True)
            entries.append(entry); save(path, entries, info); continue
        ratio = r['dpm']['images_per_s'] / r['plain']['images_per_s']
        entry.update(dpm=r['dpm'], plain=r['plain'], ratio_dpm_over_plain=ratio, target_met=ratio >= 0.9)
        entries.append(entry)
        print(f"  {arch:12s} batch {batch:4d} {mode:16s} plain {r['plain']['images_per_s']:9.1f}"
              f"  dpm {r['dpm']['images_per_s']:9.1f} images/s  ratio {ratio:.3f}"
              f"  (first step {r['dpm']['first_step_seconds']:.1f} s, peak "
              f"{r['dpm']['peak_memory_mb']:.0f} MiB, host syncs per step: dpm "
              f"{r['dpm']['host_syncs_per_step']}, plain {r['plain']['host_syncs_per_step']})",
              flush=True)
        save(path, entries, info)
    print(f'total {time.perf_counter() - t_start:.0f} s; written to {path}')


if __name__ == '__main__':
    main()
