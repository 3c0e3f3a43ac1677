#!/usr/bin/env python
"""Packs of the GPU campaign from the command line: dpm.checkpoints' bfloat16 shards (chapter A3) of
a run's model file, and of its training checkpoint (its state: last weights, weight average, Adam's
moments), so that the next GPU run resumes the optimisation instead of restarting it.

    python bench/weights.py pack OUTDIR results/x_gpu/model.pt ...     # OUTDIR/x_gpu.bf16.NN.pt
    python bench/weights.py pack --state OUTDIR W/x_gpu/checkpoint.pt  # OUTDIR/x_gpu.state.bf16.NN.pt
    python bench/weights.py unpack /tmp/x_gpu/model.pt results/x_gpu/weights/x_gpu.bf16.*.pt
    python bench/weights.py resume W/x_gpu/checkpoint.pt results/x_gpu/weights/x_gpu.state.bf16.*.pt
    python bench/weights.py bundle OUTDIR                               # OUTDIR/bundle_NN.tar
    python bench/weights.py summary results/x_gpu/training.json       # steps, minutes, runs
    python bench/weights.py check --experiment x_gpu results/x_gpu/weights/x_gpu.bf16.*.pt

`unpack` writes the model file the shards pack (float32 again; the record and configuration
unchanged); `resume` writes the training checkpoint a state pack holds, for `dpm train` to resume,
and lists the round trip through bfloat16 among the run's restarts (its step, the pack's sha256,
`optimiser: kept`), so the record counts the GPU runs. Shards that are not one complete pack of
one file are refused in one line, and `unpack`, `resume` and `check` verify the whole pack (every
shard, its sha256, the kind of file and, with --experiment, whose it is) before anything is
written: a refused pack leaves every file as it was. `bundle` puts the shards of a folder into as
few tar files of at most 16 MiB as it can (a GPU machine returns at most 8 files): `tar xf` gives
them back.
"""
import argparse, hashlib, sys, tarfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dpm.checkpoints import (CheckpointError, EXACT_BELOW, SHARD_BYTES, SHARD_NAME, atomic_save,
                             pack_shards, read_checkpoint, read_shards)


def pack(out_dir, paths, shard: int = SHARD_BYTES, exact_below: int = EXACT_BELOW,
         state: bool = False) -> list:
    "OUTDIR/<folder of the file>[.state].bf16.NN.pt for every model file (checkpoint: state)."
    written = []
    for path in map(Path, paths):
        kind = read_checkpoint(path).get('kind', 'training')
        if kind != ('training' if state else 'model'):
            raise CheckpointError(f"{path} is a {'model file' if state else 'training checkpoint'}"
                                  f", not a {'training checkpoint' if state else 'model file'}")
        name = path.parent.name + ('.state' if state else '')
        parts = pack_shards(path, out_dir, name, exact_below, shard)
        size = sum(p.stat().st_size for p in parts)
        print(f"{path}: {size / 2 ** 20:.1f} MiB in {len(parts)} shard(s) {name}.bf16.NN.pt")
        written += parts
    return written


def verify(shards, kind: str, experiment: str = None) -> dict:
    """The file the shards pack, checked completely before anything is written or removed: every
    shard there, one complete pack whose sha256 matches, a checkpoint of `kind` ('model' or
    'training'), of `experiment` and named after it if given; else one `CheckpointError`."""
    for p in map(Path, shards):
        if not p.is_file():
            raise CheckpointError(f"{p}: no such shard" + (" (a pattern that matched no file)"
                                                           if any(c in str(p) for c in '*?[')
                                                           else ""))
        m = SHARD_NAME.fullmatch(p.name)
        if m is None: raise CheckpointError(f"{p} is not named NAME.bf16.NN.pt")
        if experiment is not None and m['name'] not in (experiment, f'{experiment}.state'):
            raise CheckpointError(f"{p} is not a shard of {experiment}'s pack")
    ck = read_shards(shards)
    have = ck.get('kind', 'training')
    if have != kind:
        what = dict(training='a training checkpoint', model='a model file')
        use = '`resume`' if have == 'training' else '`unpack`'
        raise CheckpointError(f"these shards pack {what.get(have, repr(have))}, not "
                              f"{what[kind]}: use {use}")
    first = Path(sorted(map(str, shards))[0]).name
    if experiment is not None and kind == 'model' and ck.get('experiment') != experiment:
        raise CheckpointError(f"{first}: the shards pack a model of {ck.get('experiment')!r}, not "
                              f"of {experiment!r} (a foreign pack)")
    if experiment is not None and kind == 'training':        # a checkpoint names no experiment:
        from dpm.cli import get_experiment                   # its settings must be the experiment's
        extra = set(ck.get('config') or {}) - set(get_experiment(experiment).resolve({})) - {'seed'}
        if extra or not ck.get('config'):
            raise CheckpointError(f"{first}: the shards pack the state of another experiment "
                                  f"than {experiment!r} (settings {', '.join(sorted(extra)[:4])} "
                                  f"are not {experiment}'s; a foreign pack)")
    return ck


def unpack(target, shards, experiment: str = None):
    "Write the model file the shards pack to `target`, only after the whole pack is checked."
    ck = verify(shards, 'model', experiment)
    atomic_save({k: v for k, v in ck.items() if k != 'checksum'}, target)
    print(f"{target}: {len(ck['model'])} tensors from {len(shards)} shard(s)")


def resume(target, shards, experiment: str = None):
    "Write the training checkpoint a state pack holds, its round trip listed among the restarts."
    ck = verify(shards, 'training', experiment)
    sha = hashlib.sha256(b''.join(Path(p).read_bytes() for p in sorted(map(Path, shards))))
    entry = dict(step=ck['step'], train_seconds=ck['train_seconds'], optimiser='kept',
                 init=f"{Path(sorted(map(str, shards))[0]).name} (bf16 state pack)",
                 checksum=sha.hexdigest())
    ck = {k: v for k, v in ck.items() if k != 'checksum'}
    atomic_save({**ck, 'restarts': [*(ck.get('restarts') or []), entry]}, target)
    print(f"{target}: the state at step {ck['step']:,} from {len(shards)} shard(s)")


def check(shards, kind: str, experiment: str = None):
    "Verify a pack and say what it holds; nothing is written (the campaign's install runs it)."
    ck = verify(shards, kind, experiment)
    print(f"{len(shards)} shard(s): a complete {kind} pack of {ck.get('experiment')}, "
          f"step {ck.get('step', ck.get('info', {}).get('steps', '?'))}")


BUNDLE = 16 * 2 ** 20 - 2 ** 16     # bytes of a bundle at most: under the 16 MiB a machine returns


def bundle(folder, limit: int = BUNDLE) -> list:
    "The shards in `folder` in tar files bundle_NN.tar (largest first, first fit); loose ones gone."
    folder = Path(folder)
    cost = lambda p: p.stat().st_size + 1024                  # a member's header and padding
    bins = []
    for shard in sorted(folder.glob('*.bf16.*.pt'), key=cost, reverse=True):
        fit = next((b for b in bins if sum(map(cost, b)) + cost(shard) + 10240 <= limit), None)
        if fit is None: bins.append(fit := [])
        fit.append(shard)
    written = []
    for i, members in enumerate(bins):
        written.append(folder / f'bundle_{i:02d}.tar')
        with tarfile.open(written[-1], 'w') as tar:
            for m in members: tar.add(m, arcname=m.name)
        for m in members: m.unlink()
        print(f"{written[-1].name}: {', '.join(m.name for m in members)} "
              f"({written[-1].stat().st_size / 2 ** 20:.1f} MiB)")
    return written


def summary(path) -> str:
    "One line from a training.json: steps, training minutes, runs (1 + restarts), device."
    import json, math
    try: r = json.loads(Path(path).read_text())
    except (UnicodeDecodeError, ValueError): raise ValueError(f"{path} is not JSON") from None
    restarts = r.get('restarts', []) if isinstance(r, dict) else None
    ok = (isinstance(r, dict) and type(r.get('steps')) is int
          and type(r.get('train_seconds')) in (int, float) and math.isfinite(r['train_seconds'])
          and isinstance(restarts, list) and all(isinstance(x, dict) for x in restarts))
    if not ok: raise ValueError(f"{path} is not a training record (steps, train_seconds and a "
                                f"list of restarts expected)")
    kept = sum(x.get('optimiser') == 'kept' for x in restarts)
    return (f"{r['steps']:,} steps, {r['train_seconds'] / 60:.1f} minutes of training, "
            f"{len(restarts) + 1} run(s) ({kept} resumed with the optimiser), "
            f"the last on {r.get('device', '?')}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest='command', required=True)
    a = sub.add_parser('pack', help='model files (or --state: checkpoints) -> OUTDIR/*.bf16.NN.pt')
    a.add_argument('out_dir'); a.add_argument('models', nargs='+')
    a.add_argument('--state', action='store_true', help='pack training checkpoints')
    a.add_argument('--shard-bytes', type=int, default=SHARD_BYTES,
                   help='bytes per shard (default 15 MiB)')
    a.add_argument('--exact-below', type=int, default=EXACT_BELOW,
                   help='float32 tensors with fewer elements stay exact (default 65536)')
    u = sub.add_parser('unpack', help='shards -> one model file')
    u.add_argument('target'); u.add_argument('shards', nargs='+')
    s = sub.add_parser('resume', help='state shards -> a training checkpoint to resume from')
    s.add_argument('target'); s.add_argument('shards', nargs='+')
    c = sub.add_parser('check', help='verify a pack completely; write nothing')
    c.add_argument('shards', nargs='+'); c.add_argument('--state', action='store_true')
    for q in (u, s, c):
        q.add_argument('--experiment', help="the experiment the pack must hold (and be named for)")
    b = sub.add_parser('bundle', help='the shards of a folder in tar files of at most 16 MiB')
    b.add_argument('folder')
    r = sub.add_parser('summary', help="one line from a run's training.json")
    r.add_argument('record')
    args = p.parse_args(argv)
    if args.command == 'pack' and args.shard_bytes < 1: p.error('--shard-bytes must be >= 1')
    from dpm.settings import DpmError
    try:
        if args.command == 'pack':
            pack(args.out_dir, args.models, args.shard_bytes, args.exact_below, args.state)
        elif args.command == 'unpack': unpack(args.target, args.shards, args.experiment)
        elif args.command == 'resume': resume(args.target, args.shards, args.experiment)
        elif args.command == 'check':
            check(args.shards, 'training' if args.state else 'model', args.experiment)
        elif args.command == 'bundle': bundle(args.folder)
        else: print(summary(args.record))
    except (DpmError, OSError, KeyError, ValueError) as e:
        sys.exit(f"weights.py: {e}")


if __name__ == '__main__':
    main()
