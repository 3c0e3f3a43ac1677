"""Helpers of the tests/test_hostile_*.py files: a trained toy model, crafted pickles, JPEGs and
checkpoints, and a subprocess runner that bounds time, memory (RLIMIT_AS) or file size (RLIMIT_FSIZE)."""
import json, os, pickle, signal, struct, subprocess, sys, textwrap
from pathlib import Path
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, 'DPM_SMALL': '1', 'MPLBACKEND': 'Agg', 'OMP_NUM_THREADS': '1', 'PYTHONPATH': str(ROOT)}
QUICK = ['--set', 'steps=20', '--set', 'T=10', '--set', 'eval_every=10', '--no-progress']


def moons(n=400, seed=0) -> np.ndarray:
    "n points of a half moon in units far from the origin (x ~ 100, y ~ -5): a user's own table."
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, np.pi, n)
    x = np.stack([np.cos(t), np.sin(t)], 1) * [3.0, 10.0] + [100.0, -5.0]
    return x + 0.1 * rng.standard_normal((n, 2))


def grey_folder(root: Path, n=40, size=8, seed=0) -> Path:
    "A folder of n grey PNG files of size x size random pixels, 000.png, 001.png, ..."
    from PIL import Image
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8), 'L').save(root / f'{i:03d}.png')
    return root


def hole_mask(path: Path, size=8) -> np.ndarray:
    "An inpainting mask PNG at `path`: white (known) around a black square hole of half the size."
    from PIL import Image
    mask = np.full((size, size), 255, np.uint8)
    mask[size // 4:3 * size // 4, size // 4:3 * size // 4] = 0
    Image.fromarray(mask).save(path)
    return mask


def dpm(*args, env=None, timeout=120, limits=None, stdin=None):
    """Run the console script in a subprocess; `limits`: Python code run first (e.g. setrlimit)."""
    code = (limits or '') + '\nfrom dpm.cli import main; main()'
    return subprocess.run([sys.executable, '-c', code, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**ENV, **(env or {})}, timeout=timeout, stdin=stdin)


def one_line(r, *words, code=None):
    "A refusal: non-zero exit, the last line of stderr one `dpm:` line naming `words`, no traceback."
    err = r.stderr.strip()
    assert r.returncode != 0 and (code is None or r.returncode == code), (r.returncode, r.stdout, err)
    assert 'Traceback' not in err and len(err.splitlines()) == 1 and err.startswith('dpm: '), err
    assert not err.startswith('dpm: dpm:'), err
    for w in words: assert w in err, (w, err)
    return err


def exits(f, *words):
    "In-process: `main` raises SystemExit with one `dpm:` line naming `words`."
    try: f()
    except SystemExit as e:
        msg = str(e.code)
        assert msg.startswith('dpm: ') and '\n' not in msg and not msg.startswith('dpm: dpm:'), msg
        for w in words: assert w in msg, (w, msg)
        return msg
    raise AssertionError('no SystemExit')


class Call:
    "Pickles as the call f(*args), then BUILD with `state` if given: how a hostile pickle asks for things."
    def __init__(self, f, args, state=None): self.f, self.args, self.state = f, args, state
    def __reduce__(self): return (self.f, self.args) if self.state is None else (self.f, self.args, self.state)


def cifar_batch(n=2, seed=0, labels=None, protocol=4, str_keys=False):
    "A small valid CIFAR-10 batch (n images) as pickle bytes."
    rng = np.random.default_rng(seed)
    d = {b'batch_label': b'test', b'data': rng.integers(0, 256, (n, 3072), dtype=np.uint8),
         b'labels': list(labels if labels is not None else rng.integers(0, 10, n).tolist())}
    if str_keys: d = {k.decode(): v for k, v in d.items()}
    return pickle.dumps(d, protocol=protocol)


def py2_cifar_batch(data: np.ndarray, labels):
    """A batch as Python 2's cPickle wrote CIFAR-10 (protocol 2, 8-bit strings as BINSTRING), read with
    encoding='bytes' as the real files are."""
    def s(b): return (b'U' + bytes([len(b)]) + b) if len(b) < 256 else (b'T' + struct.pack('<i', len(b)) + b)
    def i(v): return b'J' + struct.pack('<i', v)
    n, m = data.shape
    return (b'\x80\x02}q\x00(' + s(b'data') + b'cnumpy.core.multiarray\n_reconstruct\nq\x01cnumpy\nndarray\n'
            b'q\x02K\x00\x85' + s(b'b') + b'\x87Rq\x03(K\x01' + i(n) + i(m) + b'\x86cnumpy\ndtype\nq\x04'
            + s(b'u1') + b'K\x00K\x01\x87Rq\x05(K\x03' + s(b'|') + b'NNN' + i(-1) + i(-1) + b'K\x00tb\x89'
            + s(data.tobytes()) + b'tb' + s(b'labels') + b']q\x06(' + b''.join(b'K' + bytes([l]) for l in labels)
            + b'eu.')


def cifar_dir(root: Path, n=2, protocol=4):
    "root/cifar-10-batches-py with the six batches of n images each."
    d = root / 'cifar-10-batches-py'; d.mkdir(parents=True, exist_ok=True)
    for k, name in enumerate([f'data_batch_{j}' for j in range(1, 6)] + ['test_batch']):
        (d / name).write_bytes(cifar_batch(n, seed=k, protocol=protocol))
    return d


def jpeg(path: Path, h=40, w=60, level=100):
    from PIL import Image
    Image.fromarray(np.full((h, w), level, np.uint8)).save(path, format='JPEG', quality=95)
    return path


def bark_dir(root: Path, per_class=2):
    "root/T01 ... T04 with per_class small grey JPEGs each."
    for k, c in enumerate(('T01', 'T02', 'T03', 'T04')):
        (root / c).mkdir(parents=True, exist_ok=True)
        for j in range(per_class): jpeg(root / c / f'{c}_{j:02d}.jpg', 80, 100, 30 * k + 10 * j)
    return root


def huge_header_jpeg(path: Path, side=9000):
    "A small JPEG whose header claims side x side pixels."
    small = jpeg(path.with_suffix('.small'), 16, 16)
    raw = bytearray(small.read_bytes()); small.unlink()
    sof = raw.index(b'\xff\xc0')
    raw[sof + 5:sof + 9] = side.to_bytes(2, 'big') * 2
    path.write_bytes(bytes(raw))
    return path


def sparse(path: Path, size: int):
    "A sparse file of `size` bytes (no disk space used)."
    with open(path, 'wb') as f: f.truncate(size)
    return path


def python(code: str, timeout=120, env=None):
    "Run Python code in a subprocess (dpm importable)."
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                          env={**ENV, **(env or {})}, timeout=timeout)


# Run first in a subprocess: after the imports, allow only 768 MiB more address space than is mapped.
LIMIT_MEMORY = '''
import resource, re
import dpm.training, dpm.data, dpm.cli, dpm.swiss_roll
vm = int(re.search(r'VmSize:\\s+(\\d+) kB', open('/proc/self/status').read())[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (768 << 20), vm + (768 << 20)))
'''


def limit_file_size(n: int) -> str:
    "Code that makes writes beyond n bytes fail with EFBIG (as a full disk fails), not kill the process."
    return f'''
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({n}, {n}))
'''


def toy_model(out: Path):
    "Train the small swiss roll into `out` in this process (a few seconds); the run's info."
    from dpm.experiments import run
    from dpm.swiss_roll import SWISS_ROLL
    os.environ['DPM_SMALL'] = '1'
    return run(SWISS_ROLL, out, dict(steps=20, T=10, eval_every=10), progress=False)[2]
