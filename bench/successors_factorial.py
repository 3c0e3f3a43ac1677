#!/usr/bin/env python
"""The study of chapter 15b (`dpm.factorial`): every cell on one forward process, one record per
data set, cell, schedule and seed, written atomically; a record that exists is skipped, so the
campaign resumes where it stopped.

The jobs are a list in priority order: the first campaign (the swiss roll's cells, the two MNIST
cells of the U-Net's question, the jump's demonstration, MNIST's other cells, t uniform for -K);
then the -K cells with t drawn by the bound's weights (`-is`, eq-succ-is) on the swiss roll; the
older swiss-roll cells trained again to score their samples' coverage (`resample_cell`, written
to samples/ beside the records after checking that K reproduces); MNIST's `-is` cells. Each
worker process claims the next job nobody has claimed (a lock file beside the records) and runs
it on one thread; a cell's seeds should all run on one processor (`check_study`):

    OMP_NUM_THREADS=1 nice -n 15 PYTHONPATH=. python bench/successors_factorial.py --worker &
    ... --data mnist                           # this worker only MNIST's jobs
    touch results/successors/study/.stop       # every worker stops after its current job
    ... --list                                 # the jobs: which are done, which locked by whom
    ... --floors --data swiss_roll             # the real data's and the Gaussian's sample measures
    DPM_SMALL=1 ... --out /tmp/s --seeds 0     # a tiny campaign (a smoke test)

A lock names its worker ('pid N on HOST'); a worker that finds a lock whose process is gone on
this host (killed) takes the job over and says so; the jobs it leaves to running workers it names
when it ends. To resume after a stop: remove `.stop` and start the worker again; records and
supplements that exist are skipped, and a job that was running when it stopped starts from its
beginning. Records of a cell that has not all its seeds yet wait in pending/ (read by nothing, so
the chapter and `check_study` see whole cells only): move them back up before resuming.
"""
import argparse, json, os, sys, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'bench'))
from dpm.factorial import (STUDY_BUDGET, run_cell, sample_floors, write_record, study_dir,
                           resample_cell, supplement_path, JUMP_SEEDS)

SEEDS = (0, 1, 2, 3, 4)
PLAN = (             # (data, cells, schedule, fixes, train or resample), in priority order
    ('swiss_roll', ('ref-learned-K', 'eps-tilde-K', 'eps-tilde-simple', 'eps-interp-hybrid'),
     'linear', False, 'train'),
    ('mnist', ('eps-tilde-simple', 'unet-eps-tilde-simple'), 'linear', False, 'train'),
    ('swiss_roll', ('ref-learned-K', 'eps-tilde-K', 'eps-tilde-simple'), 'jump', True, 'train'),
    ('mnist', ('eps-tilde-K',), 'linear', False, 'train'),
    ('mnist', ('ref-learned-K', 'eps-interp-hybrid'), 'linear', False, 'train'),
    # the -K cells again with t drawn in proportion to the bound's weights (eq-succ-is)
    ('swiss_roll', ('eps-tilde-K-is', 'ref-learned-K-is'), 'linear', False, 'train'),
    # the samples' coverage (eq-fact-cover) for the older swiss-roll cells that are compared
    ('swiss_roll', ('eps-tilde-simple', 'eps-interp-hybrid'), 'linear', False, 'resample'),
    ('mnist', ('eps-tilde-K-is',), 'linear', False, 'train'),
    ('mnist', ('ref-learned-K-is',), 'linear', False, 'train'),
)


def jobs(seeds):
    "Every job of PLAN, seeds outermost within a block: a stopped campaign has whole seeds."
    return [(data, cell, schedule, seed, fixes, kind) for data, cells, schedule, fixes, kind in PLAN
            for seed in (seeds[:JUMP_SEEDS] if schedule == 'jump' else seeds) for cell in cells]


from campaign_locks import claim, lock_state   # locks that name their worker


def done(out: Path, name: str, kind: str) -> bool:
    "A job is done when its record (train) or its record's supplement (resample) exists."
    return (supplement_path(out, name) if kind == 'resample' else out / f'{name}.json').exists()


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
        path = out / 'floors.json'                # the data sets not asked for are kept
        have = json.loads(path.read_text()) if path.exists() else {}
        write_record({**have, **{data: sample_floors(data, STUDY_BUDGET[data]['n_samples'])
                                 for data in a.data}}, path)
        return
    todo = [job for job in jobs(a.seeds) if job[0] in a.data]
    if a.list or not a.worker:
        for data, cell, schedule, seed, _, kind in todo:
            name = f'{data}-{cell}-{schedule}-seed{seed}'
            ok = done(out, name, kind)
            print(f"{'done' if ok else '    '} {data} {cell} {schedule} seed {seed} {kind}"
                  + ('' if ok else f"  {lock_state(out / f'.{kind}-{name}.lock')}").rstrip())
        return
    skipped = []
    for data, cell, schedule, seed, fixes, kind in todo:
        name = f'{data}-{cell}-{schedule}-seed{seed}'
        if (out / '.stop').exists(): break                 # stop between jobs when asked
        if done(out, name, kind): continue
        if not claim(out / f'.{kind}-{name}.lock'):
            skipped.append(f"{name} ({lock_state(out / f'.{kind}-{name}.lock')})"); continue
        t0 = time.perf_counter()
        try:
            if kind == 'resample':
                s = resample_cell(data, cell, seed, schedule, out)
                print(f"{name}: resampled, K {s['K_bits']:.5f} (record {s['K_bits_record']:.5f}, "
                      f"reproduces {s['reproduces']}), samples {s['samples']}, "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
                continue
            r = run_cell(data, cell, seed, schedule, out, fixes)
        except Exception as e:                            # the next job still runs
            print(f"{name}: failed with {type(e).__name__}: {e}", flush=True); continue
        finally: (out / f'.{kind}-{name}.lock').unlink(missing_ok=True)
        if not r.get('complete'): print(f"{name}: {r.get('failed', 'incomplete')}"); continue
        s = r['samples']
        print(f"{name}: {r['steps']} steps, {r['cpu_seconds']:.0f} CPU s, K "
              f"{r['scores']['as_specified']['K_bits']:.4f} {r['unit']}, samples "
              f"{ {k: round(v, 3) for k, v in s.items() if isinstance(v, float)} }, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    for job in skipped: print(f"skipped {job}", flush=True)


if __name__ == '__main__':
    main()
