"""Time the image chapters' expensive evaluation calls (11_dead_leaves, 13_mnist), the way they
were and the way they are now, back to back in one process on the committed full-scale models
(one thread). Reports process CPU seconds (the VM is shared, so wall time depends on the load).

    python bench/image_eval_parts.py [--out bench/image_eval_parts.json] [--n 100]

Each pair computes the same quantity; the script also prints their largest difference.
The "before" code is copied here from the package as it was (readout summed after the 1x1
readout; LinearReverse variances per row; bound_terms' default chunk of 2^21 numbers).
"""
import argparse, copy, json, math, os
os.environ.setdefault('DPM_SMALL', '0')
import torch
from dpm.experiments import machine
from dpm.reverse import VAR_MIN
from dpm.baselines import LinearReverse, paired_bounds
from dpm.image_network import ImageReverse
from dpm.experiments import train_or_load, build
from dpm import mnist as mn, dead_leaves as dl
from before_after import cpu, pair_recorder          # bench/ is the script's directory


def raw_before(self, xt, t):
    "Before: the readout's 2CJ numbers per pixel, then the sum over the bumps (eq-net-readout)."
    self._check_images(xt)
    B, (C, H, W) = xt.shape[0], self.event_shape
    y = self.readout(self.mlp_1x1(self.features(xt))).reshape(B, 2, C, self.J, H, W)
    g = self.bumps.g[t - 1].to(y.dtype)
    return torch.einsum('bkcjhw,bj->bkchw', y, g).to(torch.promote_types(xt.dtype, torch.float32))


def linear_before(self, xt, t):
    "Before: every quantity per row, the variances' matrix product included."
    t = self.check_input(xt, t)
    B, dtype = len(xt), torch.promote_types(xt.dtype, torch.float32)
    x = xt.reshape(B, -1).to(dtype)
    U, m = self.lin_eigvecs.to(dtype), self.lin_mean.to(dtype)
    beta, root_prev, root_t, p_prev, p_t = self._steps(t, x)
    w = (x - root_t * m) @ U
    gain = (1 - beta).sqrt() * (p_prev - 1) / p_t
    mean = (1 - beta).sqrt() * x + beta * (root_prev * m + (gain * w) @ U.T)
    var = (beta * p_prev / p_t) @ (U * U).T
    return mean.reshape(xt.shape), var.clamp(min=VAR_MIN).reshape(xt.shape)


class Before:
    "Context: the package's ImageReverse.raw and LinearReverse.forward as they were."
    def __enter__(self):
        self.saved = ImageReverse.raw, LinearReverse.forward
        ImageReverse.raw, LinearReverse.forward = raw_before, linear_before
    def __exit__(self, *a): ImageReverse.raw, LinearReverse.forward = self.saved


def kmeans_plain(x, k, iters=20, seed=0):
    "Before: Lloyd's algorithm, every distance every iteration (chapter 13 as it was)."
    gen = torch.Generator().manual_seed(seed)
    x = x.float()
    c = x[torch.randperm(len(x), generator=gen)[:k]].clone()
    for _ in range(iters):
        a = ((x * x).sum(1, keepdim=True) + (c * c).sum(1) - 2 * x @ c.T).argmin(1)
        counts = torch.bincount(a, minlength=k)
        sums = torch.zeros_like(c).index_add_(0, a, x)
        c[counts > 0] = sums[counts > 0] / counts[counts > 0, None]
    return c.double()


def kmeans_pruned(x, k, iters=20, seed=0, slack=1e-3):
    "After: chapter 13's kmeans (distances recomputed only where the bounds allow a change)."
    gen = torch.Generator().manual_seed(seed)
    x = x.float()
    c = x[torch.randperm(len(x), generator=gen)[:k]].clone()
    xx, rows = (x * x).sum(1), torch.arange(len(x))
    a = torch.zeros(len(x), dtype=torch.long)
    up, low = torch.full((len(x),), math.inf), torch.zeros(len(x), k)
    for _ in range(iters):
        others = low.clone(); others[rows, a] = math.inf
        redo = (up > others.min(1).values - slack).nonzero()[:, 0]
        dist = (xx[redo, None] + (c * c).sum(1) - 2 * x[redo] @ c.T).clamp(min=0).sqrt()
        a[redo] = dist.argmin(1); low[redo] = dist
        up[redo] = dist[torch.arange(len(redo)), a[redo]]
        counts = torch.bincount(a, minlength=k)
        sums = torch.zeros_like(c).index_add_(0, a, x)
        c_new = c.clone(); c_new[counts > 0] = sums[counts > 0] / counts[counts > 0, None]
        shift = (c_new - c).norm(dim=1); c = c_new
        up += shift[a]; low -= shift
    return c.double()


def main():
    ap = argparse.ArgumentParser(); ap.add_argument('--out'); ap.add_argument('--n', type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    pair = pair_recorder(rows, cpu, unit='cpu_s', width=64, digits=4)
    kdiff = lambda a, b: max((a[k]['k'] - b[k]['k']).abs().max().item() for k in a)
    n = args.n
    with torch.no_grad():
        d, rev, info, cfg = train_or_load(mn.MNIST, progress=False)
        x = mn._data(cfg, 0)[1][:n]
        models = dict(network=rev, linear=rev.linear)
        def old():
            with Before(): return paired_bounds(d, models, x, 1, cfg['eval_batch'], chunk=1 << 21)
        pair(f"MNIST K of network + linear model, {n} images x 999 steps", old,
             lambda: paired_bounds(d, models, x, 1, cfg['eval_batch']), kdiff)
        def old_net():
            with Before(): return paired_bounds(d, dict(network=rev), x, 1, cfg['eval_batch'])
        pair(f"  of it: the readout fold alone (network, chunk 2^16)", old_net,
             lambda: paired_bounds(d, dict(network=rev), x, 1, cfg['eval_batch']), kdiff)
        def sample(before):
            def f():
                if not before: return mn.sample_unit(d, rev, 48, seed=3)
                with Before(): return mn.sample_unit(d, rev, 48, seed=3)
            return f
        pair("MNIST 48 samples x 1000 steps (figure)", sample(True), sample(False),
             lambda a, b: (a - b).abs().max().item())
        d2, rev2, info2, cfg2 = train_or_load(dl.DEAD_LEAVES, progress=False)
        x2 = dl._data(cfg2, 0)[1][:n]
        fast2 = copy.deepcopy(rev2).to(memory_format=torch.channels_last)
        def old2():
            with Before():
                return paired_bounds(d2, dict(network=rev2, linear=rev2.linear), x2, 1,
                                     cfg2['eval_batch'], chunk=1 << 21)
        pair(f"dead leaves K of network + linear model, {n} images x 99 steps", old2,
             lambda: paired_bounds(d2, dict(network=fast2, linear=fast2.linear), x2, 1,
                                   cfg2['eval_batch']), kdiff)
        pair("  of it: channels-last alone (network, chunk 2^16)",
             lambda: paired_bounds(d2, dict(network=rev2), x2, 1, cfg2['eval_batch']),
             lambda: paired_bounds(d2, dict(network=fast2), x2, 1, cfg2['eval_batch']), kdiff)
    gen = lambda work: lambda: dl.dead_leaves_levels(
        2000, 64, generator=torch.Generator().manual_seed(1), work=work)
    pair("dead leaves generator, 2,000 images of 64x64 (tests of the whole batch -> 2^20)",
         gen(2 ** 40), gen(None), lambda a, b: (a != b).sum().item())
    train = mn.unit_images('train')
    pair("MNIST k-means, 500 centroids of 50,000 digits, 20 iterations",
         lambda: kmeans_plain(train, 500), lambda: kmeans_pruned(train, 500),
         lambda a, b: (a - b).abs().max().item())
    full = {**mn.MNIST.config}
    mn.mnist_scaler()                                     # cached: neither pays it
    pair("chapter 13: build the book's network to count its parameters",
         lambda: mn._build(full), lambda: build(mn.MNIST, full, weights_follow=True),
         lambda a, b: 0.0)
    out = dict(machine=dict(machine(), note='cores shared, 1 thread'),
               torch=torch.__version__, load_average=os.getloadavg()[0], rows=rows)
    if args.out:
        with open(args.out, 'w') as f: json.dump(out, f, indent=1)


if __name__ == '__main__':
    main()
