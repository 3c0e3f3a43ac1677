"""Time the toy chapters' expensive evaluation calls, the way they were and the way they are now,
back to back in one process on the committed full-scale models (one thread).

    python bench/toy_eval_parts.py [--out results/toy_eval_parts.json]

Each pair computes the same quantity; the script also prints their largest difference.
"""
import argparse, json, math, os
os.environ.setdefault('DPM_SMALL', '0')
import torch
from dpm.experiments import machine
from dpm.config import small_scale
from dpm.diffusion import LN2
from dpm import swiss_roll as sr, heartbeat as hb
from before_after import wall, pair_recorder          # bench/ is the script's directory


def log_q_every_node(x, noise, m=40_000, batch=500):
    "Before: eq-sr-true summed over all m nodes for every point."
    centre, c = sr.roll_moments(noise)
    gamma, s2 = (sr.roll_curve(sr._quadrature_nodes(m)) - centre) / c, (noise / c) ** 2
    return torch.cat([torch.logsumexp(-0.5 * ((xb[:, None] - gamma[None]) ** 2).sum(-1) / s2, 1)
                      for xb in x.double().split(batch)]) - math.log(m) - math.log(2 * math.pi * s2)


def p_star_direct(d, points, xt, t):
    "Before: eq-hb-oracle with five marginals and five posteriors per call."
    x0s = [phi.expand_as(xt) for phi in points.to(xt)]
    log_w = torch.stack([d.log_prob(xt, d.marginal(x0, t)) for x0 in x0s], 1)
    post = torch.stack([d.posterior(x0, xt, t) for x0 in x0s], 1)
    return (torch.softmax(log_w, 1)[..., None] * post).sum(1).clamp(1e-6, 1 - 1e-6)


class Mixed(torch.nn.Module):
    "The model without its `readout` attribute: the bound then calls it on mixed steps (before)."
    def __init__(self, net): super().__init__(); self.net = net
    def forward(self, xt, t): return self.net(xt, t)


def main():
    ap = argparse.ArgumentParser(); ap.add_argument('--out'); args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    pair = pair_recorder(rows, wall)
    with torch.inference_mode():
        cfg = sr.SWISS_ROLL.resolve(None)
        held = sr._data(cfg, 0)[1]
        pair(f'swiss roll true log q, {len(held)} held-out points, noise 0.3',
             lambda: log_q_every_node(held, 0.3), lambda: sr.true_log_likelihood(held, 0.3),
             lambda a, b: (a - b).abs().max())
        x1 = sr.sample_swiss_roll(4000, 1.0, torch.Generator().manual_seed(3))
        pair('swiss roll true log q, 4,000 points, noise 1.0 (thickest)',
             lambda: log_q_every_node(x1, 1.0), lambda: sr.true_log_likelihood(x1, 1.0),
             lambda a, b: (a - b).abs().max())
        d, rev = hb.trained_model('heartbeat')
        x = hb.heartbeats().repeat(200, 1)
        def bound(model):
            torch.manual_seed(1)
            return torch.cat([d.bound(model, xb) for xb in x.split(1000)])
        pair(f'heartbeat K, {len(x)} sequences x {d.T - 1} steps (bump readout)',
             lambda: bound(Mixed(rev)), lambda: bound(rev), lambda a, b: (a - b).abs().max())
        oracle = hb.OptimalReverse(d, hb.heartbeats())
        g = torch.Generator().manual_seed(5)
        t = torch.randint(2, d.T + 1, (10_000,), generator=g)
        xt = d.draw(d.marginal(hb.sample_heartbeats(10_000, g), t))
        pair('heartbeat optimal kernel, 10,000 rows x 200 calls',
             lambda: [p_star_direct(d, oracle.points, xt, t) for _ in range(200)][-1],
             lambda: [oracle(xt, t) for _ in range(200)][-1], lambda a, b: (a - b).abs().max())
    res = dict(machine=dict(machine(), note='cores shared, 1 thread'),
               torch=torch.__version__, small=small_scale(), rows=rows)
    if args.out:
        with open(args.out, 'w') as f: json.dump(res, f, indent=1)


if __name__ == '__main__':
    main()
