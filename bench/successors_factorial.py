#!/usr/bin/env python
"""The study of chapter 15b (`dpm.factorial`): every cell on one forward process, one record per
data set, cell, schedule and seed, written atomically; a record that exists is skipped, so the
campaign resumes where it stopped.

One campaign, one machine: the jobs are a list in priority order (the swiss roll's cells, the two
MNIST cells of the U-Net's question, the jump's demonstration, MNIST's third cell, the optional
MNIST cells); each worker process claims the next job nobody has claimed (a lock file beside the
records) and runs it on one thread, so that two workers share a 2-core machine:

    for w in 1 2; do OMP_NUM_THREADS=1 nice -n 15 PYTHONPATH=. \\
        python bench/successors_factorial.py --worker & done
    ... --data mnist                           # this worker only MNIST's jobs
    touch results/successors/study/.stop       # every worker stops after its current job
    ... --list                                 # the jobs: which are done, which locked by whom

A lock names its worker ('pid N on HOST'); a worker that finds a lock whose process is gone on
this host (killed) takes the job over and says so; the jobs it leaves to running workers it names
when it ends.
    ... --floors                               # the real data's and the Gaussian's sample measures
    DPM_SMALL=1 ... --out /tmp/s --seeds 0     # a tiny campaign (a smoke test)
"""
import argparse, os, platform, sys, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dpm.factorial import (STUDY_BUDGET, run_cell, sample_floors, write_record, study_dir)

SEEDS = (0, 1, 2, 3, 4)
PLAN = (                     # (data, cells, schedule, fixes), in priority order
    ('swiss_roll', ('ref-learned-K', 'eps-tilde-K', 'eps-tilde-simple', 'eps-interp-hybrid'),
     'linear', False),
    ('mnist', ('eps-tilde-simple', 'unet-eps-tilde-simple'), 'linear', False),
    ('swiss_roll', ('ref-learned-K', 'eps-tilde-K', 'eps-tilde-simple'), 'jump', True),
    ('mnist', ('eps-tilde-K',), 'linear', False),
    ('mnist', ('ref-learned-K', 'eps-interp-hybrid'), 'linear', False),
)


JUMP_SEEDS = 3                # the jump's demonstration: a demonstration, not a verdict


def jobs(seeds):
    "Every job of PLAN, seeds outermost within a block: a stopped campaign has whole seeds."
    return [(data, cell, schedule, seed, fixes) for data, cells, schedule, fixes in PLAN
            for seed in (seeds[:JUMP_SEEDS] if schedule == 'jump' else seeds) for cell in cells]


def lock_owner(lock: Path):
    "(pid, host) that a lock file names ('pid N on HOST'), or None if it names none (yet)."
    try: words = lock.read_text(encoding='utf-8', errors='replace').split()
    except OSError: return None
    if len(words) >= 4 and words[0] == 'pid' and words[1].isascii() and words[1].isdigit() \
            and words[2] == 'on': return int(words[1]), ' '.join(words[3:])
    return None


def owner_alive(owner) -> bool:
    "Whether a lock's process runs: on another host it cannot be told, so it counts as running."
    if owner is None or owner[1] != platform.node(): return True
    try: os.kill(owner[0], 0)
    except ProcessLookupError: return False
    except (PermissionError, OverflowError): return True
    return True


def claim(lock: Path, say=print) -> bool:
    """Create the lock file naming this process ('pid N on HOST'), or False if a running worker
    has it; a lock whose process is gone (a worker killed) is taken over, and said so."""
    for _ in range(3):
        try: fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            owner = lock_owner(lock)
            if owner_alive(owner): return False
            stale = lock.with_name(f'{lock.name}.stale.{os.getpid()}')
            try: os.rename(lock, stale)                       # one taker wins the rename
            except FileNotFoundError: continue
            if lock_owner(stale) != owner:                    # a fresh lock taken by mistake
                os.rename(stale, lock); return False
            stale.unlink(missing_ok=True)
            say(f"{lock.name}: its worker (pid {owner[0]} on {owner[1]}) is gone: "
                f"taking the job over", flush=True)
            continue
        with os.fdopen(fd, 'w') as f: f.write(f'pid {os.getpid()} on {platform.node()}\n')
        return True
    return False


def lock_state(lock: Path) -> str:
    "What --list says of a job's lock: '' if none."
    if not lock.exists(): return ''
    owner = lock_owner(lock)
    if owner is None: return 'locked (no owner named: remove the lock if no worker runs)'
    return (f"locked by pid {owner[0]} on {owner[1]} "
            f"({'running' if owner_alive(owner) else 'gone: the next worker takes it over'})")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--out', default=str(study_dir()))
    p.add_argument('--seeds', type=int, nargs='+', default=list(SEEDS))
    p.add_argument('--data', nargs='+', default=list(STUDY_BUDGET), help='only these data sets')
    p.add_argument('--worker', action='store_true', help='run unclaimed jobs until none is left')
    p.add_argument('--list', action='store_true', help='print the jobs and stop')
    p.add_argument('--floors', action='store_true', help="write the floors' record and stop")
    a = p.parse_args(argv)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    if a.floors:
        write_record({data: sample_floors(data, STUDY_BUDGET[data]['n_samples'])
                      for data in STUDY_BUDGET}, out / 'floors.json')
        return
    todo = [job for job in jobs(a.seeds) if job[0] in a.data]
    if a.list or not a.worker:
        for data, cell, schedule, seed, _ in todo:
            name = f'{data}-{cell}-{schedule}-seed{seed}'
            done = (out / f'{name}.json').exists()
            print(f"{'done' if done else '    '} {data} {cell} {schedule} seed {seed}"
                  + ('' if done else f"  {lock_state(out / f'.{name}.lock')}").rstrip())
        return
    skipped = []
    for data, cell, schedule, seed, fixes in todo:
        name = f'{data}-{cell}-{schedule}-seed{seed}'
        if (out / '.stop').exists(): break                 # stop between jobs when asked
        if (out / f'{name}.json').exists(): continue
        if not claim(out / f'.{name}.lock'):
            skipped.append(f"{name} ({lock_state(out / f'.{name}.lock')})"); continue
        t0 = time.perf_counter()
        try: r = run_cell(data, cell, seed, schedule, out, fixes)
        except Exception as e:                            # the next job still runs
            print(f"{name}: failed with {type(e).__name__}: {e}", flush=True); continue
        finally: (out / f'.{name}.lock').unlink(missing_ok=True)
        if not r.get('complete'): print(f"{name}: {r.get('failed', 'incomplete')}"); continue
        s = r['samples']
        print(f"{name}: {r['steps']} steps, {r['cpu_seconds']:.0f} CPU s, K "
              f"{r['scores']['as_specified']['K_bits']:.4f} {r['unit']}, samples "
              f"{ {k: round(v, 3) for k, v in s.items() if isinstance(v, float)} }, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    for job in skipped: print(f"skipped {job}", flush=True)


if __name__ == '__main__':
    main()
