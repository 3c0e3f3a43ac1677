"""Hostile files, class by class: checkpoints checked as a schema after the checksum (class 4), atomic
writes, permissions and leftovers of killed writes (class 5), readers that check sizes before they
allocate, under RLIMIT_AS (class 2), and named pipes that must not block a reader (class 6)."""
import errno, os, pickle, signal, stat, subprocess, sys, time, zipfile
from pathlib import Path
import numpy as np
import pytest
import torch
from hostile_helpers import (ROOT, ENV, Call, LIMIT_MEMORY, bark_dir, cifar_batch, cifar_dir, exits,
                             huge_header_jpeg, jpeg, python, sparse, toy_model)
from dpm.settings import DataError
from dpm.files import atomic_write, open_regular, remove_leftovers
from dpm.checkpoints import CheckpointError, atomic_save, upgrade_checkpoint
from dpm.training import load_checkpoint, train, TrainConfig
from dpm.experiments import load_model
from dpm.data import load_bark, load_cifar10, read_cifar_batch, read_grey_jpeg
from dpm.swiss_roll import SWISS_ROLL


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp('toy')
    toy_model(out)
    return out


def crafted(src: Path, dst: Path, change=None, drop=()):
    "A copy of checkpoint `src` with keys changed or dropped, saved with a valid checksum."
    ck = torch.load(src, weights_only=True)
    ck = {k: v for k, v in ck.items() if k not in drop and k != 'checksum'}
    ck.update(change or {})
    atomic_save(ck, dst)
    return dst


# 4. a checksum proves integrity, not sense --------------------------------------------------------
@pytest.mark.parametrize('change, drop, words', [
    ({}, ('signature',), "lacks 'signature'"),
    ({}, ('step',), "lacks 'step'"),
    ({'step': -1_000_000}, (), 'step must be an integer in [0, 2**53], got -1000000'),
    ({'step': float('nan')}, (), 'step must be an integer'),
    ({'step': 2 ** 60}, (), 'step must be'),
    ({'step': True}, (), 'step must be'),
    ({'train_seconds': float('inf')}, (), 'train_seconds must be'),
    ({'history': [{'step': 'x'}]}, (), 'history must be'),
    ({'rng': torch.zeros(3, dtype=torch.uint8)}, (), 'rng must be a generator state'),
    ({'rng': torch.zeros(3)}, (), 'rng must be a generator state'),
    ({'optimizer': {'state': {}}}, (), 'optimizer must be'),
    ({'kind': 'weights'}, (), 'unknown kind'),
    ({'format': 'dpm-checkpoint-3'}, (), 'newer dpm'),
    ({'format': 'dpm-checkpoint-x'}, (), 'not a dpm checkpoint'),
    ({'format': 7}, (), 'not a dpm checkpoint'),
])
def test_training_checkpoints_are_checked_as_a_schema(trained, tmp_path, change, drop, words):
    bad = crafted(trained / 'checkpoint.pt', tmp_path / 'checkpoint.pt', change, drop)
    with pytest.raises(CheckpointError, match=None) as e: load_checkpoint(bad)
    assert words in str(e.value), str(e.value)


def test_stored_configuration_passes_check_config(trained, tmp_path):
    ck = torch.load(trained / 'checkpoint.pt', weights_only=True)
    bad = crafted(trained / 'checkpoint.pt', tmp_path / 'c.pt', {'config': {**ck['config'], 'lr': -1.0}})
    with pytest.raises(CheckpointError, match='stored configuration is not valid: configuration key lr=-1.0'):
        load_checkpoint(bad)
    m = torch.load(trained / 'model.pt', weights_only=True)
    bad = crafted(trained / 'model.pt', tmp_path / 'model.pt', {'config': {**m['config'], 'width': 0}})
    with pytest.raises(CheckpointError, match='width=0'): load_model(SWISS_ROLL, bad)


def test_resuming_a_negative_or_nan_step_is_refused_before_any_step(trained, tmp_path, monkeypatch):
    from dpm.cli import main
    monkeypatch.setenv('DPM_SMALL', '1')
    for step in (-1_000_000, float('nan')):
        out = tmp_path / str(step); out.mkdir()
        crafted(trained / 'checkpoint.pt', out / 'checkpoint.pt', {'step': step})
        exits(lambda: main(['train', 'swiss_roll', '--out', str(out), '--set', 'steps=20', '--set', 'T=10',
                            '--set', 'eval_every=10', '--no-progress']), 'step must be')
        assert not (out / 'model.pt').exists()


@pytest.mark.parametrize('what', ['optimizer shapes', 'optimizer groups', 'optimizer setting', 'ema', 'dtype'])
def test_resume_state_must_fit_the_model(trained, tmp_path, what):
    ck = torch.load(trained / 'checkpoint.pt', weights_only=True)
    opt = ck['optimizer']
    if what == 'optimizer shapes':
        i = next(i for i, s in opt['state'].items() if s['exp_avg'].numel() > 1)
        opt['state'][i]['exp_avg'] = torch.zeros(7)
    elif what == 'optimizer groups': opt['param_groups'][0]['params'] = opt['param_groups'][0]['params'][:-1]
    elif what == 'optimizer setting': opt['param_groups'][0]['betas'] = ('a', 'b')
    elif what == 'ema': ck['ema'] = {k: v for k, v in ck['ema'].items() if k != 'n_averaged'}
    else:
        k = next(iter(ck['model'])); ck['model'][k] = ck['model'][k].double()
    bad = crafted(trained / 'checkpoint.pt', tmp_path / 'checkpoint.pt', ck)
    os.environ['DPM_SMALL'] = '1'
    from dpm.experiments import build, experiment_data
    cfg = SWISS_ROLL.resolve(dict(steps=20, T=10, eval_every=10)); cfg['seed'] = 0
    d, rev = build(SWISS_ROLL, cfg)
    x, h = experiment_data(SWISS_ROLL, cfg)
    with pytest.raises(CheckpointError, match='does not fit|not one group|other types'):
        train(d, rev, x, h, TrainConfig.from_dict(cfg), checkpoint=bad, progress=False, full_config=cfg)


def test_tensors_beyond_their_bytes_and_deep_nesting_are_refused(trained, tmp_path):
    huge = torch.zeros(1).as_strided((10 ** 6, 10 ** 6), (0, 0))
    ck = torch.load(trained / 'model.pt', weights_only=True); ck['checksum'] = '0' * 64   # not checked yet
    ck['info'] = {**ck['info'], 'extra': huge}
    torch.save(ck, tmp_path / 'a.pt')                    # as a crafted file would hold it
    with pytest.raises(CheckpointError, match='reaches beyond its bytes'): load_checkpoint(tmp_path / 'a.pt')
    deep = []
    for _ in range(200): deep = [deep]
    ck['info'] = {**ck['info'], 'extra': deep}
    torch.save(ck, tmp_path / 'b.pt')
    with pytest.raises(CheckpointError, match='nested deeper'): load_checkpoint(tmp_path / 'b.pt')


def test_compressed_or_lying_archives_are_refused(trained, tmp_path):
    with zipfile.ZipFile(trained / 'model.pt') as z, \
         zipfile.ZipFile(tmp_path / 'deflated.pt', 'w', zipfile.ZIP_DEFLATED) as out:
        for info in z.infolist(): out.writestr(info.filename, z.read(info))
    with pytest.raises(CheckpointError, match='compressed or claim more bytes'):
        load_checkpoint(tmp_path / 'deflated.pt')
    sparse(tmp_path / 'sparse.pt', 1 << 30)               # a GiB of zeros: refused without reading it
    t = time.time()
    with pytest.raises(CheckpointError, match='not a zip archive'): load_checkpoint(tmp_path / 'sparse.pt')
    assert time.time() - t < 5


def test_newer_formats_are_refused_by_upgrade_and_the_file_is_left_alone(trained, tmp_path, monkeypatch):
    from dpm.cli import main
    bad = crafted(trained / 'model.pt', tmp_path / 'model.pt', {'format': 'dpm-checkpoint-3'})
    before = bad.read_bytes()
    with pytest.raises(CheckpointError, match='newer dpm'): upgrade_checkpoint(bad)
    exits(lambda: main(['upgrade', str(bad)]), 'newer dpm')
    assert bad.read_bytes() == before


def test_upgrade_writes_only_what_evaluate_can_load(trained, tmp_path, monkeypatch):
    from dpm.cli import main
    monkeypatch.setenv('DPM_SMALL', '1')
    old = torch.load(trained / 'model.pt', weights_only=True)
    del old['checksum']; old['format'] = 'dpm-checkpoint-1'
    for name, change, words in [('wide', {'config': {**old['config'], 'width': 8192}}, 'refusing to build'),
                                ('nobody', {'experiment': 'no_such'}, 'unknown experiment'),
                                ('unsigned', {'signature': None}, 'signature must be'),
                                ('negative', {'info': {**old['info'], 'steps': -3}}, 'info must be')]:
        f = tmp_path / f'{name}.pt'; torch.save({**old, **change}, f)
        before = f.read_bytes()
        exits(lambda: main(['upgrade', str(f)]), words)
        assert f.read_bytes() == before, name                   # nothing relabelled
    f = tmp_path / 'model.pt'; torch.save(old, f)
    main(['upgrade', str(f)])
    main(['sample', 'swiss_roll', '--out', str(tmp_path), '-n', '5'])     # what upgrade wrote, evaluate loads


# 5. atomic writes, permissions, leftovers ----------------------------------------------------------
class FullDisk:
    "A file object whose writes fail with ENOSPC once `room` bytes are written (monkeypatched os.fdopen)."
    def __init__(self, f, room): self.f, self.room = f, room
    def write(self, b):
        self.room -= len(b)
        if self.room < 0: raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.f.write(b)
    def __getattr__(self, k): return getattr(self.f, k)
    def __enter__(self): return self
    def __exit__(self, *a): self.f.close()


@pytest.mark.parametrize('room', [0, 100, 5000])
def test_a_full_disk_leaves_the_previous_file(trained, tmp_path, monkeypatch, room):
    target = tmp_path / 'model.pt'; target.write_bytes((trained / 'model.pt').read_bytes())
    real = os.fdopen
    monkeypatch.setattr(os, 'fdopen', lambda fd, *a, **kw: FullDisk(real(fd, *a, **kw), room))
    ck = torch.load(target, weights_only=True)
    with pytest.raises(OSError, match='No space left on device') as e: atomic_save(ck, target)
    assert str(target) in str(e.value)                            # names the file
    monkeypatch.setattr(os, 'fdopen', real)
    assert load_checkpoint(target)['checksum'] == ck['checksum']  # the previous version, intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ['model.pt']


@pytest.mark.parametrize('umask, mode', [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_get_the_usual_permissions(tmp_path, umask, mode):
    from dpm.files import write_json
    old = os.umask(umask)
    try:
        write_json({'a': 1}, tmp_path / 'record.json'); atomic_save({'x': 1}, tmp_path / 'model.pt')
        atomic_write(tmp_path / 'samples.pt', lambda f: torch.save(torch.zeros(2), f))
    finally: os.umask(old)
    for p in tmp_path.iterdir(): assert stat.S_IMODE(p.stat().st_mode) == mode, (p.name, oct(p.stat().st_mode))


def test_run_writes_ordinary_permissions(trained):
    for name in ('training.json', 'model.pt', 'checkpoint.pt'):
        assert stat.S_IMODE((trained / name).stat().st_mode) == 0o666 & ~_umask(), name


def _umask():
    m = os.umask(0o022); os.umask(m); return m


def test_leftovers_of_killed_writes_are_removed_on_the_next_start(trained, tmp_path):
    "SIGKILL a process in the middle of atomic_save, again and again; the next run removes exactly its files."
    out = tmp_path / 'run'; out.mkdir()
    (out / 'notes.tmp').write_text('not ours')
    (out / 'checkpoint.pt.ab12cd34.tmp').write_bytes(b'half')               # an older dpm's leftover
    code = f'''
import os, signal, time
from dpm.files import atomic_write
for _ in range(5):                                # fork a writer, SIGKILL it in the middle of its write
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        def slow(f):
            f.write(b'x' * 1000); f.flush(); os.write(w, b'1'); time.sleep(60)
        atomic_write({str(out / "checkpoint.pt")!r}, slow); os._exit(0)
    os.read(r, 1); os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0)
'''
    assert python(code).returncode == 0
    left = sorted(p.name for p in out.glob('*.dpm.tmp'))
    assert len(left) == 5
    info = toy_model(out)                                       # the next start
    assert sorted(p.name for p in out.iterdir() if 'tmp' in p.name) == ['notes.tmp']
    assert info['completed']


def test_open_regular_refuses_without_blocking(tmp_path):
    os.mkfifo(tmp_path / 'pipe')
    t = time.time()
    with pytest.raises(DataError, match='named pipe'): open_regular(tmp_path / 'pipe')
    assert time.time() - t < 1
    with pytest.raises(DataError, match='does not exist'): open_regular(tmp_path / 'none')
    with pytest.raises(DataError, match='a device'): open_regular('/dev/zero')


# 3 and 6. real data: provenance, broken sets are errors, pipes do not block ----------------------------
@pytest.mark.parametrize('how', ['fifo', 'directory', 'missing', 'dangling'])
def test_a_broken_cifar_set_under_dpm_data_is_an_error_not_a_fallback(tmp_path, monkeypatch, how):
    d = cifar_dir(tmp_path)
    (d / 'data_batch_2').unlink()
    if how == 'fifo': os.mkfifo(d / 'data_batch_2')
    elif how == 'directory': (d / 'data_batch_2').mkdir()
    elif how == 'dangling': (d / 'data_batch_2').symlink_to(tmp_path / 'gone')
    monkeypatch.setenv('DPM_DATA', str(tmp_path))
    words = {'fifo': 'named pipe', 'directory': 'is a directory', 'missing': 'not data_batch_2',
             'dangling': 'link to a missing file'}[how]
    with pytest.raises(DataError, match=words): load_cifar10('train', n=10)
    assert load_cifar10('test').record.name == 'cifar10'                 # the test split is whole


def test_real_cifar_provenance_is_recorded(tmp_path, monkeypatch):
    import dpm.cifar10 as C
    from dpm.experiments import data_records, describe_data
    cifar_dir(tmp_path, n=3)
    monkeypatch.setenv('DPM_DATA', str(tmp_path)); monkeypatch.setenv('DPM_SMALL', '1')
    C._images.cache_clear()
    try:
        recs = data_records(C.CIFAR10, C.CIFAR10.resolve(), 0)
    finally: C._images.cache_clear()
    # 15 training images: the last fifth validate (eq-train-stop), the rest train
    assert [(r['name'], r['split'], r['n'], r['stand_in']) for r in recs] == [
        ('cifar10', 'train', 12, False), ('cifar10', 'test', 3, False), ('cifar10', 'valid', 3, False)]
    assert str(tmp_path) in describe_data(recs[0]) and 'the real data' in describe_data(recs[0])


@pytest.mark.parametrize('make, words', [
    (lambda p: os.mkfifo(p), 'named pipe'), (lambda p: p.mkdir(), 'is a directory'),
    (lambda p: p.symlink_to(p.parent / 'gone'), 'link to a missing file'),
    (lambda p: p.write_bytes(b''), 'not a readable JPEG'),
    (lambda p: p.write_bytes(b'\xff\xd8\xff\xe0' + b'\0' * 100), 'not a readable JPEG'),
    (lambda p: huge_header_jpeg(p), '9000x9000 pixels'),
    (lambda p: p.write_bytes(jpeg(p.with_suffix('.x')).read_bytes()[:200]), 'not a readable JPEG'),
    (lambda p: sparse(p, 1 << 36), 'more than any JPEG image'),
])
def test_hostile_bark_files_are_one_error_naming_the_file(tmp_path, make, words):
    bark_dir(tmp_path)
    make(tmp_path / 'T02' / 'T02_zz.jpg')
    with pytest.raises(DataError, match=words) as e: load_bark('train', root=tmp_path, n=10, patch=16)
    assert 'T02_zz.jpg' in str(e.value)


def test_incomplete_bark_is_an_error(tmp_path):
    bark_dir(tmp_path)
    for p in (tmp_path / 'T03').iterdir(): p.unlink()
    with pytest.raises(DataError, match='T03/\\*.jpg has fewer than 2'): load_bark('train', root=tmp_path)


# 2. memory bombs, under RLIMIT_AS ----------------------------------------------------------------------
def test_memory_bombs_are_refused_before_allocating(tmp_path):
    "Every bomb in one subprocess whose address space allows 768 MiB beyond what it has mapped."
    rebuild = np._core.multiarray._reconstruct
    l1 = [0] * 1000; l3 = [[l1] * 1000] * 1000
    one = np.zeros((1, 3072), np.uint8)
    bombs = {
        'reconstruct': {b'data': Call(rebuild, (np.ndarray, (10 ** 6, 10 ** 6), b'B')), b'labels': [0]},
        'setstate': {b'data': Call(rebuild, (np.ndarray, (0,), b'b'), (1, (10 ** 6, 10 ** 6), np.dtype('u1'),
                                                                        False, b'')), b'labels': [0]},
        'lists_as_data': {b'data': l3, b'labels': [0]},
        'lists_as_labels': {b'data': one, b'labels': l3},
        'frombuffer': {b'data': Call(np._core.numeric._frombuffer, (b'', np.dtype('u1'), (10 ** 6, 10 ** 6), 'C'))},
    }
    for name, obj in bombs.items(): (tmp_path / name).write_bytes(pickle.dumps(obj, protocol=2))
    (tmp_path / 'bytearray8').write_bytes(b'\x80\x05\x96' + (1 << 40).to_bytes(8, 'little') + b'x.')
    (tmp_path / 'binbytes8').write_bytes(b'\x80\x04\x8e' + (1 << 40).to_bytes(8, 'little') + b'x.')
    dtype_state = (3, '|', None, None, None, 1 << 40, -1, 0)
    (tmp_path / 'dtype').write_bytes(pickle.dumps({b'data': Call(np.dtype, ('u1', False, True), dtype_state)},
                                                  protocol=2))
    sparse(tmp_path / 'sparse', 1 << 36)
    huge_header_jpeg(tmp_path / 'huge.jpg')
    sizes = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    assert max(v for k, v in sizes.items() if k != 'sparse') < 30_000, sizes        # small files all
    r = python(LIMIT_MEMORY + f'''
import os, tempfile
from pathlib import Path
from dpm.settings import DpmError, MAX_ELEMENTS
from dpm.experiments import run
from dpm.data import read_cifar_batch, read_grey_jpeg, load_cifar10
from dpm.cli import main
from dpm.swiss_roll import SWISS_ROLL
os.environ['DPM_SMALL'] = '1'
d = Path({str(tmp_path)!r})
def refused(name, f):
    try: f()
    except DpmError as e: print('refused', name, str(e)[:300])
    except SystemExit as e: print('refused', name, str(e.code)[:300])
cases = [n for n in os.listdir(d) if n != 'huge.jpg']
for n in sorted(cases): refused(n, lambda: read_cifar_batch(d / n))
refused('huge.jpg', lambda: read_grey_jpeg(d / 'huge.jpg'))
refused('n_train', lambda: load_cifar10('train', n=10 ** 12))
out = Path(tempfile.mkdtemp())
for kv in ('batch_size=1000000000000', 'T=1000000000000', 'width=1000000000', 'n_train=1000000000000'):
    k, v = kv.split('=')
    refused(kv, lambda: run(SWISS_ROLL, out / k, {{k: int(v), 'steps': 2}}, progress=False))
main(['train', 'swiss_roll', '--out', str(out / 'ok'), '--set', 'steps=2', '--set', 'T=10', '--no-progress'])
refused('-n', lambda: main(['sample', 'swiss_roll', '--out', str(out / 'ok'), '-n', '1000000000000']))
print('done')
''', timeout=300)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[-1] == 'done', r.stdout + r.stderr
    refused = {l.split()[1]: l for l in lines if l.startswith('refused')}
    want = set(sizes) | {'n_train', 'batch_size=1000000000000', 'T=1000000000000', 'width=1000000000',
                         'n_train=1000000000000', '-n'}
    assert set(refused) == want, (want - set(refused), r.stdout)
    assert 'more than any CIFAR-10 batch' in refused['sparse'] and '9000x9000' in refused['huge.jpg']
    assert 'batch_size=1000000000000 asks for minibatches' in refused['batch_size=1000000000000']
    assert 'refusing to build' in refused['T=1000000000000'] and 'refusing to build' in refused['width=1000000000']


# 6. a named pipe in every place dpm reads --------------------------------------------------------------
def test_named_pipes_never_block(tmp_path, trained):
    from dpm.settings import DpmError
    from dpm.files import out_lock
    from dpm.cli import parse_overrides
    from test_hostile_cli import within
    bark_dir(tmp_path / 'bark'); os.mkfifo(tmp_path / 'bark' / 'T01' / 'T01_zz.jpg')
    os.mkfifo(tmp_path / 'config.json')
    out = tmp_path / 'out'; out.mkdir(); os.mkfifo(out / 'model.pt'); os.mkfifo(out / '.lock')
    for f, words in [(lambda: load_bark('train', root=tmp_path / 'bark', n=5, patch=8), 'named pipe'),
                     (lambda: parse_overrides(tmp_path / 'config.json'), 'named pipe'),
                     (lambda: load_checkpoint(out / 'model.pt'), 'named pipe'),
                     (lambda: out_lock(out).__enter__(), 'not a regular file')]:
        with within(30), pytest.raises(DpmError, match=words): f()
