#!/usr/bin/env python
"""Dead leaves ablation at equal training budget (issue 9): the paper's image network against the
reference code's variant, and the beta schedule learned with frozen noise against the fixed one.

Each of the four runs trains the CPU-scale `dead_leaves` configuration (same data, seed, steps and
batch) for --steps steps in its own subprocess, then evaluates K (every t) on --n-eval held-out images.
Each run also records K per held-out image, evaluated with the same forward noise in every run (common
random numbers), so that differences between runs can be paired. Writes results/dead_leaves_ablation.json,
which the book's dead leaves chapter displays. Finished runs are reused (their checkpoints in runs/).

    python bench/dead_leaves_ablation.py                  # 4 runs, 1500 steps each, 1 thread
    python bench/dead_leaves_ablation.py --steps 3000 --threads 2 --parallel 2
"""
import argparse, json, os, subprocess, sys, time, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = [('paper', True), ('paper', False), ('reference', True), ('reference', False)]


def one(variant, learn, steps, n_eval, seed, threads):
    "Train and evaluate one run in this process; print its record as JSON on the last line."
    import torch
    torch.set_num_threads(threads)
    os.environ.pop('DPM_SMALL', None)
    from dpm.dead_leaves import DEAD_LEAVES, _data, _evaluate
    from dpm.experiments import run
    overrides = dict(variant=variant, learn_schedule=learn, steps=steps, eval_every=0, n_eval=n_eval)
    tag = f"{variant}-{'learned' if learn else 'fixed'}-{steps}-seed{seed}"
    d, reverse, info = run(DEAD_LEAVES, ROOT / 'runs' / 'dead_leaves_ablation' / tag, overrides, seed,
                           'cpu', progress=False)
    cfg = DEAD_LEAVES.resolve(overrides); cfg['seed'] = seed
    held = _data(cfg, seed)[1][:n_eval]
    res = _evaluate(d, reverse, cfg, held)
    # per-image K (bits per pixel) on the same images with the same forward noise in every run
    # (common random numbers), for paired differences between runs
    from dpm.diffusion import LN2
    torch.manual_seed(seed + 1)
    with torch.no_grad():
        k = torch.cat([d.bound(reverse, xb) for xb in held.split(cfg['eval_batch'])]).double()
    res['K_per_image_bits'] = (k / LN2 / held[0].numel()).tolist()
    res.update(variant=variant, learn_schedule=learn, train_seconds=info['train_seconds'],
               steps=info['steps'], load_average=os.getloadavg()[0])
    print(json.dumps(res))


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--steps', type=int, default=1500)
    p.add_argument('--n-eval', type=int, default=200)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--parallel', type=int, default=1, help='runs at a time (each its own process)')
    p.add_argument('--one', nargs=2, metavar=('VARIANT', 'LEARN'), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        return one(a.one[0], a.one[1] == '1', a.steps, a.n_eval, a.seed, a.threads)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(a.threads))
    env.pop('DPM_SMALL', None)
    t0, results, pending = time.time(), [], list(RUNS)
    while pending:
        batch, pending = pending[:a.parallel], pending[a.parallel:]
        procs = [subprocess.Popen([sys.executable, __file__, '--one', v, str(int(l)), '--steps', str(a.steps),
                                   '--n-eval', str(a.n_eval), '--seed', str(a.seed), '--threads',
                                   str(a.threads)], stdout=subprocess.PIPE, env=env, text=True)
                 for v, l in batch]
        for (v, l), pr in zip(batch, procs):
            out, _ = pr.communicate()
            if pr.returncode: raise SystemExit(f"run {v}, learn={l} failed")
            r = json.loads(out.strip().splitlines()[-1])
            print(f"{v:10s} {'learned' if l else 'fixed':8s} K = {r['K_bits']:.3f} ± {r['K_bits_se']:.3f} "
                  f"bits/pixel ({r['train_seconds']:.0f} s)", flush=True)
            results.append(r)
    sys.path.insert(0, str(ROOT))
    from dpm.experiments import machine
    record = dict(steps=a.steps, n_eval=a.n_eval, seed=a.seed, threads=a.threads, parallel=a.parallel,
                  runs=results, wall_seconds=time.time() - t0, machine=machine(),
                  time=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'))
    path = ROOT / 'results' / 'dead_leaves_ablation.json'
    path.write_text(json.dumps(record, indent=2) + '\n')
    print(f"written {path}")


if __name__ == '__main__':
    main()
