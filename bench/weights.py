#!/usr/bin/env python
"""Model files small enough to leave a GPU machine and to commit: the weights of `model.pt` in
bfloat16 (float32 tensors only; integer and float64 buffers and the eigenbasis of a linear path stay
exact), split into shards
of at most 15 MiB, and put back together as a loadable `model.pt` (float32 again).

    python bench/weights.py pack OUTDIR results/x_gpu/model.pt ...   # OUTDIR/x_gpu.bf16.NN.pt
    python bench/weights.py unpack results/x_gpu/model.pt OUTDIR/x_gpu.bf16.*.pt
"""
import io, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch

SHARD = 15 * 2 ** 20

def pack(out_dir, paths):
    from dpm.training import load_checkpoint
    out_dir = Path(out_dir); out_dir.mkdir(parents=True, exist_ok=True)
    for path in map(Path, paths):
        ck = load_checkpoint(path)
        ck['model'] = {k: v.bfloat16() if v.dtype == torch.float32 and '.lin_' not in k else v
                       for k, v in ck['model'].items()}     # a linear path's eigenbasis stays float32
        buf = io.BytesIO(); torch.save(ck, buf); raw = buf.getvalue()
        name = path.parent.name
        for i in range(0, len(raw), SHARD):
            (out_dir / f'{name}.bf16.{i // SHARD:02d}.pt').write_bytes(raw[i:i + SHARD])
        print(f'{path}: {len(raw) / 2 ** 20:.1f} MiB in {(len(raw) + SHARD - 1) // SHARD} shard(s)')

def unpack(target, shards):
    from dpm.training import atomic_save
    raw = b''.join(Path(s).read_bytes() for s in sorted(shards))
    ck = torch.load(io.BytesIO(raw), weights_only=True)
    ck['model'] = {k: v.float() if v.dtype == torch.bfloat16 else v for k, v in ck['model'].items()}
    atomic_save(ck, target)
    print(f'{target}: {len(ck["model"])} tensors from {len(shards)} shard(s)')

if __name__ == '__main__':
    cmd, *args = sys.argv[1:]
    if cmd == 'pack': pack(args[0], args[1:])
    elif cmd == 'unpack': unpack(args[0], args[1:])
    else: sys.exit(__doc__)
