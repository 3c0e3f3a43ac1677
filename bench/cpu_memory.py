#!/usr/bin/env python
"""CPU time lost to the allocator, before and after appendix A6, in one run (the machine is noisy).

"Before" is the package as it was at --before (default: the commit before A6, checked out into a
temporary git worktree); "after" is this checkout. For every experiment, each phase runs in a fresh
process of each tree, alternately, at full scale (DPM_SMALL=0) with --threads threads:

  train    `dpm.training.train` for a few steps, as `dpm.experiments.run` calls it (inside
           `kept_memory()` where the tree has it), its setting-up not counted: steps/s
  sample   `d.sample` of n examples through all T steps: samples/s
  evaluate `evaluate_bound` (K at every t) on n held-out examples: seconds

and reports per phase user and sys CPU seconds, minor page faults and peak RSS (getrusage of the
phase's process), with the ratios after/before. Then the command a new user runs,
`dpm sample mnist_gpu --out D -n 100 --device cpu`, end to end, each tree. The targets: sys time at
most 5 % of user time everywhere; that command at least 2x faster; peak RSS at most 1.5x before.

    python bench/cpu_memory.py                         # everything
    python bench/cpu_memory.py --only mnist_gpu swiss_roll --no-cli
    python bench/cpu_memory.py --json results/cpu_memory.json   # also write the rows
"""
import argparse, json, os, platform, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE = '337fc0b'                    # main before appendix A6 and the two-ends value checks

# experiment: (training steps, samples, held-out examples) at full scale, sized to seconds a phase
SIZES = {
    'swiss_roll': (300, 2000, 2000), 'heartbeat': (100, 200, 200),
    'dead_leaves': (20, 10, 20), 'mnist': (20, 10, 20), 'cifar10': (20, 10, 20),
    'bark': (20, 10, 20),
    'mnist_gpu': (5, 100, 20), 'dead_leaves_gpu': (2, 1, 1), 'cifar10_gpu': (2, 2, 2),
    'bark_gpu': (2, 1, 1),
}

CHILD = r"""
import contextlib, json, resource, sys, time, torch
import dpm
from dpm.cli import get_experiment
from dpm.experiments import build, experiment_data
from dpm.training import evaluate_bound, train, TrainConfig
name, phase, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
exp = get_experiment(name)

def usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_minflt

cfg = exp.resolve(dict(steps=size, eval_every=0) if phase == 'train' else {})
d, reverse = build(exp, cfg, 0)
train_x, held = experiment_data(exp, cfg, 0)
if phase == 'train':                    # the loop as run() calls it, setting-up not counted
    kept = getattr(getattr(dpm, 'cpu_memory', None), 'kept_memory', contextlib.nullcontext)
    before = usage(); t0 = time.perf_counter()
    with kept():
        info = train(d, reverse, train_x, held[:200], TrainConfig.from_dict(cfg), None, None,
                     False, full_config=cfg)
    wall = time.perf_counter() - t0; rate = size / wall
else:
    reverse.eval()
    before = usage(); t0 = time.perf_counter()
    with torch.no_grad():
        if phase == 'sample': d.sample(reverse, (size, *held.shape[1:]))
        else: evaluate_bound(d, reverse, held[:size], batch_size=size)
    wall = time.perf_counter() - t0; rate = size / wall
after = usage()
print(json.dumps(dict(wall=wall, rate=rate, user=after[0] - before[0], sys=after[1] - before[1],
                      faults=after[2] - before[2],
                      peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      allocator=getattr(getattr(dpm, 'cpu_memory', None), 'ALLOCATOR', 'none'))))
"""


def child_env(tree: Path, threads: int) -> dict:
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(('MALLOC_', 'DPM_KEEP', 'GLIBC_TUNABLES', 'PYTHONPATH'))}
    return {**keep, 'PYTHONPATH': str(tree), 'DPM_SMALL': '0', 'OMP_NUM_THREADS': str(threads),
            'MKL_NUM_THREADS': str(threads), 'PYTHONHASHSEED': '0'}


def measure(tree: Path, name: str, phase: str, size: int, threads: int) -> dict:
    "One phase in a fresh process of `tree`."
    out = subprocess.run([sys.executable, '-c', CHILD, name, phase, str(size)], cwd=tree,
                         env=child_env(tree, threads), capture_output=True, text=True)
    if out.returncode != 0:
        return dict(error=(out.stderr.strip().splitlines() or ['?'])[-1][:160])
    return json.loads(out.stdout.strip().splitlines()[-1])


def cli_sample(tree: Path, threads: int) -> dict:
    "`dpm sample mnist_gpu --out D -n 100 --device cpu` end to end: wall, user, sys, faults, RSS."
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, '-m', 'dpm', 'sample', 'mnist_gpu', '--out', out,
                              '-n', '100', '--device', 'cpu'], cwd=tree,
                             env=child_env(tree, threads), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
        _, status, r = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        if status != 0: return dict(error=p.stderr.read().decode()[-160:])
    return dict(wall=wall, rate=100 / wall, user=r.ru_utime, sys=r.ru_stime, faults=r.ru_minflt,
                peak_mb=r.ru_maxrss / 1024)


def before_tree(rev: str) -> Path:
    "A detached worktree of `rev` in a temporary folder (removed at exit by the caller)."
    where = Path(tempfile.mkdtemp(prefix='dpm-before-')) / 'tree'
    subprocess.run(['git', 'worktree', 'add', '--detach', '-q', str(where), rev], cwd=ROOT,
                   check=True)
    return where


def row(label: str, b: dict, a: dict) -> dict:
    if 'error' in b or 'error' in a:
        print(f"{label:26s} failed: {b.get('error') or a.get('error')}", flush=True)
        return dict(what=label, before=b, after=a)
    ratio = lambda k: a[k] / b[k] if b[k] else float('nan')
    r = dict(what=label, before=b, after=a, speedup=a['rate'] / b['rate'],
             user_ratio=ratio('user'), sys_ratio=ratio('sys'), faults_ratio=ratio('faults'),
             rss_ratio=ratio('peak_mb'), sys_share_before=b['sys'] / max(b['user'], 1e-9),
             sys_share_after=a['sys'] / max(a['user'], 1e-9))
    print(f"{label:26s} {b['rate']:9.2f} -> {a['rate']:9.2f}/s  x{r['speedup']:4.2f}   "
          f"user {b['user']:6.1f} -> {a['user']:6.1f} s   sys {b['sys']:6.1f} -> {a['sys']:5.1f} s "
          f"({100 * r['sys_share_before']:3.0f}% -> {100 * r['sys_share_after']:3.0f}% of user)   "
          f"faults {b['faults']:9,} -> {a['faults']:7,}   peak {b['peak_mb']:6.0f} -> "
          f"{a['peak_mb']:6.0f} MB (x{r['rss_ratio']:.2f})", flush=True)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--before', default=BEFORE, help='the revision measured as "before"')
    ap.add_argument('--only', nargs='*', default=list(SIZES), choices=list(SIZES))
    ap.add_argument('--phases', nargs='*', default=['train', 'sample', 'evaluate'])
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--no-cli', action='store_true', help='skip the end-to-end dpm sample command')
    ap.add_argument('--json', help='write the rows to this file')
    args = ap.parse_args()
    old = before_tree(args.before)
    print(f"before: {args.before} ({old}); after: this checkout ({ROOT}); {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, {args.threads} threads a process, DPM_SMALL=0\n"
          f"{'phase':26s} {'rate before -> after':>24s}", flush=True)
    rows = []
    try:
        for name in args.only:
            for phase, size in zip(('train', 'sample', 'evaluate'), SIZES[name]):
                if phase not in args.phases: continue
                b = measure(old, name, phase, size, args.threads)
                a = measure(ROOT, name, phase, size, args.threads)
                rows.append(row(f"{name} {phase} ({size})", b, a))
        if not args.no_cli:
            rows.append(row('dpm sample mnist_gpu -n 100', cli_sample(old, args.threads),
                            cli_sample(ROOT, args.threads)))
    finally:
        subprocess.run(['git', 'worktree', 'remove', '--force', str(old)], cwd=ROOT)
    done = [r for r in rows if 'speedup' in r]
    worst = max((r['sys_share_after'] for r in done), default=float('nan'))
    print(f"\nsys/user after, worst phase: {100 * worst:.1f} % (target <= 5 %); "
          f"peak RSS after/before, largest: {max((r['rss_ratio'] for r in done), default=0):.2f} "
          f"(cap 1.5)")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(
            machine=f"{platform.node()}: {platform.processor() or platform.machine()}, "
                    f"{os.cpu_count()} cores", threads=args.threads, before=args.before,
            rows=rows), indent=1) + '\n')


if __name__ == '__main__':
    main()
