#!/usr/bin/env python
"""Model files small enough to leave a GPU machine and to commit: the large weight tensors of a
`model.pt` in bfloat16 (float32 tensors of at least 65,536 elements; the small ones, such as the
schedule, the data's shift and scale and the biases, the eigenbasis of a linear path, '.lin_', and
integer or float64 tensors stay exact), split into shards of at most 15 MiB, and put back together
as a loadable `model.pt` (float32 again, the record and configuration unchanged).

    python bench/weights.py pack OUTDIR results/x_gpu/model.pt ...   # OUTDIR/x_gpu.bf16.NN.pt
    python bench/weights.py unpack /tmp/x_gpu/model.pt results/x_gpu/weights/x_gpu.bf16.*.pt
    python bench/weights.py summary results/x_gpu/training.json      # steps, minutes, runs

A shard is a small torch file: the model's name, the shard's number, how many there are, the
sha256 of the whole packed file and its bytes. `unpack` refuses, in one line, shards of different
models or packs, a missing or repeated number, and bytes that do not match the sha256. Shards of
the first campaign (raw byte slices, no header) are still read, in the order of their numbers.
"""
import argparse, hashlib, io, re, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch

SHARD = 15 * 2 ** 20                 # bytes of model per shard: a GPU machine returns 16 MiB files
EXACT_BELOW = 65_536                 # float32 tensors with fewer elements stay float32
FORMAT = 'dpm-shard-1'
NAME = re.compile(r'(?P<name>.+)\.bf16\.(?P<index>[0-9]{2,})\.pt')


class ShardError(ValueError):
    "Shards that do not make one model file."


def _packed(path, exact_below: int = EXACT_BELOW):
    "The model file at `path`, its large float32 tensors (not '.lin_') in bfloat16: (bytes, keys)."
    from dpm.training import load_checkpoint
    ck = load_checkpoint(path)
    if ck.get('kind') != 'model':
        raise ShardError(f"{path} is a training checkpoint, not a model file (model.pt)")
    keys = [k for k, v in ck['model'].items()
            if v.dtype == torch.float32 and '.lin_' not in k and v.numel() >= exact_below]
    ck = {**ck, 'model': {k: v.bfloat16() if k in keys else v for k, v in ck['model'].items()},
          'bf16_keys': keys}
    buf = io.BytesIO(); torch.save(ck, buf)
    return buf.getvalue(), keys


def pack(out_dir, paths, shard: int = SHARD, exact_below: int = EXACT_BELOW) -> list:
    "Write OUTDIR/<dir of model>.bf16.NN.pt for every model file; the paths written."
    out_dir, written = Path(out_dir), []
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in map(Path, paths):
        raw, keys = _packed(path, exact_below)
        name, n = path.parent.name, (len(raw) + shard - 1) // shard
        sha = hashlib.sha256(raw).hexdigest()
        for old in out_dir.glob(f'{name}.bf16.*.pt'): old.unlink()        # no stale shards left
        for i in range(n):
            part = torch.frombuffer(bytearray(raw[i * shard:(i + 1) * shard]), dtype=torch.uint8)
            target = out_dir / f'{name}.bf16.{i:02d}.pt'
            torch.save(dict(format=FORMAT, name=name, index=i, count=n, sha256=sha, data=part),
                       target)
            written.append(target)
        print(f"{path}: {len(raw) / 2 ** 20:.1f} MiB ({len(keys)} tensors in bf16) in {n} shard(s)")
    return written


def _read(path):
    "A shard's header and bytes, or None for a raw slice of the first campaign."
    try: obj = torch.load(path, map_location='cpu', weights_only=True)
    except Exception: return None
    return obj if isinstance(obj, dict) and obj.get('format') == FORMAT else None


def _joined(shards) -> bytes:
    "The packed file the shards make, every header checked against the others."
    paths = sorted(map(Path, shards))
    if not paths: raise ShardError("no shards given")
    heads = [_read(p) for p in paths]
    if all(h is None for h in heads): return _legacy(paths)
    if any(h is None for h in heads):
        raise ShardError(f"{paths[heads.index(None)]} is not a shard of this pack (no header)")
    who = {(h['name'], h['sha256'], h['count']) for h in heads}
    if len(who) > 1:
        raise ShardError("the shards belong to different models or packs: " + ', '.join(
            f"{p.name} ({h['name']}, {h['sha256'][:12]})" for p, h in zip(paths, heads)))
    (name, sha, count), = who
    have = sorted(h['index'] for h in heads)
    if len(set(have)) < len(have):
        raise ShardError(f"{name}: shard {max(have, key=have.count):02d} given twice")
    if have != list(range(count)):
        missing = ', '.join(f'{i:02d}' for i in sorted(set(range(count)) - set(have)))
        raise ShardError(f"{name}: shard(s) {missing} of {count} missing "
                         f"(have {', '.join(f'{i:02d}' for i in have)})")
    raw = b''.join(bytes(h['data'].numpy()) for h in sorted(heads, key=lambda h: h['index']))
    if hashlib.sha256(raw).hexdigest() != sha:
        raise ShardError(f"{name}: the shards' bytes do not match their sha256 (corrupt)")
    return raw


def _legacy(paths) -> bytes:
    "Raw byte slices (the first campaign): names x.bf16.00.pt, 01, ... of one model, none missing."
    m = [NAME.fullmatch(p.name) for p in paths]
    if not all(m): raise ShardError(f"{paths[m.index(None)]} is not named NAME.bf16.NN.pt")
    names = {x['name'] for x in m}
    if len(names) > 1: raise ShardError(f"the shards belong to different models: {sorted(names)}")
    have = sorted(int(x['index']) for x in m)
    if have != list(range(len(have))):
        raise ShardError(f"{names.pop()}: shard numbers {have} are not 00, 01, ... without a gap")
    order = sorted(zip((int(x['index']) for x in m), paths))
    return b''.join(p.read_bytes() for _, p in order)


def unpack(target, shards):
    "Write the model file the shards make to `target` (float32 again); its checksum is new."
    from dpm.checkpoints import atomic_save
    from dpm.training import load_checkpoint
    raw = _joined(shards)
    try: ck = torch.load(io.BytesIO(raw), map_location='cpu', weights_only=True)
    except Exception as e:
        raise ShardError(f"the shards do not make a model file ({type(e).__name__}); "
                         f"one is missing or from another pack") from None
    keys = ck.pop('bf16_keys', None)                      # the first campaign: every bf16 tensor
    ck['model'] = {k: v.float() if (k in keys if keys is not None else v.dtype == torch.bfloat16)
                   else v for k, v in ck['model'].items()}
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    atomic_save(ck, target)
    load_checkpoint(target)                               # its structure, as every reader checks it
    print(f"{target}: {len(ck['model'])} tensors from {len(shards)} shard(s)")


def summary(path) -> str:
    "One line from a training.json: steps, training minutes, runs (1 + warm restarts), device."
    import json
    r = json.loads(Path(path).read_text())
    return (f"{r['steps']:,} steps, {r['train_seconds'] / 60:.1f} minutes of training, "
            f"{len(r.get('restarts', [])) + 1} run(s), the last on {r.get('device', '?')}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest='command', required=True)
    a = sub.add_parser('pack', help='model files -> OUTDIR/<name>.bf16.NN.pt')
    a.add_argument('out_dir'); a.add_argument('models', nargs='+')
    a.add_argument('--shard-bytes', type=int, default=SHARD,
                   help='bytes per shard (default 15 MiB)')
    a.add_argument('--exact-below', type=int, default=EXACT_BELOW,
                   help='float32 tensors with fewer elements stay exact (default 65536)')
    u = sub.add_parser('unpack', help='shards -> one model file')
    u.add_argument('target'); u.add_argument('shards', nargs='+')
    r = sub.add_parser('summary', help="one line from a run's training.json")
    r.add_argument('record')
    args = p.parse_args(argv)
    if args.command == 'pack' and args.shard_bytes < 1: p.error('--shard-bytes must be >= 1')
    from dpm.settings import DpmError
    try:
        if args.command == 'pack':
            pack(args.out_dir, args.models, args.shard_bytes, args.exact_below)
        elif args.command == 'unpack': unpack(args.target, args.shards)
        else: print(summary(args.record))
    except (ShardError, DpmError, OSError, KeyError, ValueError) as e:
        sys.exit(f"weights.py: {e}")


if __name__ == '__main__':
    main()
