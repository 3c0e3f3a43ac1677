#!/usr/bin/env python
"""The stopping rule of a paper-scale MNIST run (eq-mnist-stop, `dpm.mnist.parzen_stop`) over its
curve points, as bench/gpu_campaign.sh applies it after each one.

    python bench/curve_rule.py results/mnist_gpu /tmp/gpu_work/paper/mnist_gpu-at-*   # exit 0: stop
    python bench/curve_rule.py results/mnist_gpu ... --write /tmp/gpu_work/paper/mnist_gpu/record.json

Each argument is a record (a JSON file) or a folder holding `record.json` and `curve/step_*.json`;
folders or files that do not exist are skipped. Records of the same step count once (the last one
named). Prints one line: the rule's verdict. Exit status 0 when the rule says stop, 1 when the run
goes on, 2 on bad input. With --write RECORD, the verdict is also stored in that record (atomically)
under 'stop': whether the rule stopped the run, why, and the points it looked at.
"""
import argparse, json, os, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def fail(message: str):
    "One `dpm:` line on stderr, exit status 2."
    print(f"dpm: {message}", file=sys.stderr); sys.exit(2)


def records(paths) -> list:
    "The records named, by step: files as they are, folders by their record and curve points."
    found = {}
    for p in map(Path, paths):
        files = ([p / 'record.json', *sorted((p / 'curve').glob('step_*.json'))] if p.is_dir()
                 else [p])
        for f in files:
            if not f.is_file(): continue
            try: r = json.loads(f.read_text())
            except ValueError as e: fail(f"{f} is not a JSON record ({e})")
            try: found[r['training']['steps']] = r
            except (KeyError, TypeError): fail(f"{f} has no training steps")
    return [found[k] for k in sorted(found)]


def verdict(points) -> dict:
    "The rule over `points`: stopped or not, the reason, and the points (steps, Parzen bits)."
    from dpm.mnist import parzen_stop, PARZEN_PATIENCE
    usable = [r for r in points if 'parzen_bits' in r.get('numbers', {})]
    why = rule = parzen_stop(usable)
    last = usable[-1]['training'] if usable else {}
    if rule is None:
        why = ("its budget was reached" if last.get('completed') else
               "this GPU run's time ran out while the Parzen estimate was still rising"
               if last.get('stopped_early') else "the Parzen estimate is still rising")
    return dict(rule=f'eq-mnist-stop, patience {PARZEN_PATIENCE}', stopped=rule is not None,
                reason=why, points=[[r['training']['steps'], r['numbers']['parzen_bits']]
                                    for r in usable])


def write(record: Path, v: dict):
    "Store the verdict `v` under 'stop' in `record`, atomically."
    r = json.loads(record.read_text()); r['stop'] = v
    fd, tmp = tempfile.mkstemp(dir=record.parent, suffix='.tmp')
    with os.fdopen(fd, 'w') as f: json.dump(r, f, indent=1); f.write('\n')
    os.replace(tmp, record)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('paths', nargs='+')
    ap.add_argument('--write', type=Path, help='store the verdict in this record')
    a = ap.parse_args(argv)
    v = verdict(records(a.paths))
    print(f"{'stop' if v['stopped'] else 'go on'}: {v['reason']} "
          f"({len(v['points'])} points with a Parzen estimate)")
    if a.write is not None:
        if not a.write.is_file(): fail(f"{a.write} does not exist")
        write(a.write, v)
    return 0 if v['stopped'] else 1


if __name__ == '__main__':
    sys.exit(main())
