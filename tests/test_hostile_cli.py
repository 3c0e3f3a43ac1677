"""The command line on hostile input: every failure a user can cause is one `dpm:` line with a non-zero
exit status (class 1), outputs are written atomically even on a full disk (class 5), each run says and
records which data it used and a broken real data set is an error (class 3), and a named pipe in the
data does not hang it (class 6). Most checks call `main` in this process; a few run the console script."""
import json, os, pickle, signal, subprocess, sys
from contextlib import contextmanager
from pathlib import Path
import numpy as np
import pytest
import torch
from hostile_helpers import (ENV, Call, bark_dir, cifar_dir, dpm, exits, jpeg, limit_file_size, one_line,
                             sparse, toy_model)
from dpm.cli import main
from dpm.settings import ConfigError
from dpm.checkpoints import CheckpointError, atomic_save


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp('toy')
    toy_model(out)
    return out


@pytest.fixture
def fresh_data(monkeypatch):
    "No cached images from another test: the loaders run again (and DPM_SMALL is on)."
    import dpm.cifar10, dpm.bark
    caches = [dpm.cifar10._images, dpm.cifar10._scaler, dpm.bark._levels, dpm.bark._scaler]
    for c in caches: c.cache_clear()
    monkeypatch.setenv('DPM_SMALL', '1')
    yield
    for c in caches: c.cache_clear()


@contextmanager
def within(seconds: int):
    "Fail instead of hanging: SIGALRM after `seconds`."
    def stop(*_): raise TimeoutError(f'blocked for {seconds} s')
    old = signal.signal(signal.SIGALRM, stop); signal.alarm(seconds)
    try: yield
    finally: signal.alarm(0); signal.signal(signal.SIGALRM, old)


# 1. one line per failure ---------------------------------------------------------------------------
def test_a_refused_cifar_batch_is_one_line_from_the_console_script(tmp_path):
    d = cifar_dir(tmp_path)
    (d / 'data_batch_4').write_bytes(pickle.dumps({b'data': Call(os.system, ('echo owned',))}, protocol=2))
    r = dpm('train', 'cifar10', '--small', '--out', str(tmp_path / 'o'), '--no-progress',
            env={'DPM_DATA': str(tmp_path)})
    err = one_line(r, 'data_batch_4', 'refusing to unpickle posix.system', code=1)
    assert 'owned' not in r.stdout + err


@pytest.mark.parametrize('content, words', [
    (b'', 'not a readable CIFAR-10 batch (truncated)'),
    (np.random.default_rng(7).bytes(3000), 'not a readable CIFAR-10 batch'),   # garbage, seeded
    (None, 'not a readable CIFAR-10 batch'),                     # truncated
    (pickle.dumps([1, 2]), 'expected uint8 data'),
    (pickle.dumps({b'data': np.zeros((2, 3072), np.uint8), b'labels': [0, 12]}), 'integers 0-9'),
    (pickle.dumps({b'data': np.zeros((2, 3072), np.float32), b'labels': [0, 1]}), 'refusing numpy type'),
])
def test_broken_cifar_batches_are_one_line(tmp_path, fresh_data, monkeypatch, content, words):
    d = cifar_dir(tmp_path)
    if content is None: content = (d / 'data_batch_1').read_bytes()[:5000]
    (d / 'data_batch_1').write_bytes(content)
    monkeypatch.setenv('DPM_DATA', str(tmp_path))
    exits(lambda: main(['train', 'cifar10', '--out', str(tmp_path / 'o'), '--no-progress']), 'data_batch_1', words)


@pytest.mark.parametrize('make, words', [
    (lambda p: p.write_bytes(b'\xff\xd8\xff' + os.urandom(300)), 'not a readable JPEG'),
    (lambda p: p.write_bytes(jpeg(p.with_suffix('.x')).read_bytes()[:150]), 'not a readable JPEG'),
    (lambda p: p.mkdir(), 'is a directory'), (lambda p: p.symlink_to(p.parent / 'gone'), 'link to a missing'),
    (lambda p: os.mkfifo(p), 'named pipe'),                      # 6: blocked forever before
])
def test_broken_bark_files_are_one_line_and_never_block(tmp_path, fresh_data, monkeypatch, make, words):
    bark_dir(tmp_path / 'data')
    make(tmp_path / 'data' / 'T03' / 'T03_99.jpg')
    monkeypatch.setenv('DPM_DATA', str(tmp_path / 'data'))
    with within(60):
        exits(lambda: main(['train', 'bark', '--out', str(tmp_path / 'o'), '--no-progress']), 'T03_99.jpg', words)


def test_crafted_model_without_signature_is_one_line(trained, tmp_path):
    ck = torch.load(trained / 'model.pt', weights_only=True)
    atomic_save({k: v for k, v in ck.items() if k not in ('signature', 'checksum')}, tmp_path / 'model.pt')
    exits(lambda: main(['evaluate', 'swiss_roll', '--out', str(tmp_path)]), "lacks 'signature'")


@pytest.mark.parametrize('args, words', [
    (['--config', '{deep}'], 'nested more than 8 deep'),
    (['--config', '{list}'], 'must hold a JSON object'),
    (['--config', '{sparse}'], 'more than any config'),
    (['--config', '{binary}'], 'cannot read config'),
    (['--set', 'x=' + '[' * 5000 + ']' * 5000], 'nested more than 8'),
    (['--set', 'lr=' + '9' * 400], 'lr=9999'),                  # an integer beyond any float
    (['--set', 'steps=' + '9' * 5000], 'steps="9999'),          # beyond Python's int parsing: a string
    (['--set', 'steps'], 'KEY=VALUE'),
    (['--set', '=3'], 'unknown configuration keys'),
    (['--device', 'xpu'], "'xpu' requested, but it is not available"),
    (['--device', 'meta'], 'not available'),
    (['--device', 'cuda:-3'], 'unknown device'),
])
def test_bad_options_are_one_line(tmp_path, monkeypatch, args, words):
    monkeypatch.setenv('DPM_SMALL', '1')
    files = dict(deep=tmp_path / 'deep.json', list=tmp_path / 'list.json', sparse=tmp_path / 'sparse.json',
                 binary=tmp_path / 'binary.json')
    files['deep'].write_text('[' * 100_000 + ']' * 100_000); files['list'].write_text('[]')
    sparse(files['sparse'], 1 << 36); files['binary'].write_bytes(b'\xff\xfe\x00')
    args = [a.format(**files) if a.startswith('{') else a for a in args]
    exits(lambda: main(['train', 'swiss_roll', '--out', str(tmp_path / 'o'), *args]), *words.split('|'))
    assert not (tmp_path / 'o').exists()


@pytest.mark.parametrize('args, words', [
    (['sample', 'swiss_roll', '--out', 'o', '--seed', '18446744073709551616'], 'argument --seed: must be an integer'),
    (['sample', 'swiss_roll', '--out', 'o', '--seed', '-1'], 'in [0, 9223372036854775807]'),
    (['sample', 'swiss_roll', '--out', 'o', '-n', '0'], 'argument -n'),
    (['sample', 'swiss_roll', '--out', 'o', '-n', '1e3'], 'argument -n'),
    (['train'], 'the following arguments are required'),
    (['frobnicate'], 'invalid choice'),
])
def test_usage_errors_are_one_line_with_status_2(capsys, args, words):
    with pytest.raises(SystemExit) as e: main(args)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith('dpm: ') and words in err, err


def test_long_path_components_are_one_line(trained, tmp_path, monkeypatch):
    monkeypatch.setenv('DPM_SMALL', '1')
    long = str(tmp_path / ('x' * 300))
    for cmd in ('train', 'evaluate', 'sample'):
        exits(lambda: main([cmd, 'swiss_roll', '--out', long]), 'File name too long')
    exits(lambda: main(['train', 'swiss_roll', '--out', str(tmp_path / 'o'), '--config', long + '.json']),
          'File name too long')
    exits(lambda: main(['upgrade', long]), 'File name too long')


def test_loader_messages_are_not_doubled_and_bugs_keep_their_traceback(tmp_path, monkeypatch):
    from dpm.swiss_roll import SWISS_ROLL
    monkeypatch.setenv('DPM_SMALL', '1')
    def no_files(cfg, seed): raise ValueError('dpm: no MNIST IDX files in /nowhere')
    monkeypatch.setattr(SWISS_ROLL, 'data', no_files)
    msg = exits(lambda: main(['train', 'swiss_roll', '--out', str(tmp_path / 'a')]))
    assert msg == 'dpm: no MNIST IDX files in /nowhere'
    def bug(cfg, seed): return {}['signature']
    monkeypatch.setattr(SWISS_ROLL, 'data', bug)
    with pytest.raises(KeyError): main(['train', 'swiss_roll', '--out', str(tmp_path / 'b')])   # a traceback
    with pytest.raises(ConfigError, match='ema'):                                              # --debug: all
        main(['train', 'swiss_roll', '--out', str(tmp_path / 'c'), '--set', 'ema=2', '--debug'])


def test_sample_count_is_capped_before_allocating(trained):
    exits(lambda: main(['sample', 'swiss_roll', '--out', str(trained), '-n', '1000000000000']),
          '-n 1000000000000 asks for 2,000,000,000,000 values', 'draw at most 536,870,912')


def test_batch_size_is_capped_before_allocating(tmp_path, monkeypatch):
    monkeypatch.setenv('DPM_SMALL', '1')
    exits(lambda: main(['train', 'swiss_roll', '--out', str(tmp_path), '--set', 'batch_size=1000000000000',
                        '--no-progress']), 'batch_size=1000000000000 asks for minibatches')


# 5. outputs survive a full disk ----------------------------------------------------------------------
def test_sample_on_a_full_disk_keeps_the_previous_samples(trained, tmp_path):
    out = tmp_path / 'o'; out.mkdir()
    (out / 'model.pt').write_bytes((trained / 'model.pt').read_bytes())
    assert main(['sample', 'swiss_roll', '--out', str(out), '-n', '10']) is None
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    r = dpm('sample', 'swiss_roll', '--out', str(out), '-n', '20000', limits=limit_file_size(30_000))
    one_line(r, 'samples.pt', 'File too large', 'intact', code=1)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before           # unchanged, nothing left over
    assert torch.load(out / 'samples.pt').shape == (10, 2)


def test_evaluate_on_a_full_disk_leaves_the_previous_figures(tmp_path, monkeypatch):
    "The figures of `dpm evaluate` on a disk that fills up during the write: no empty figure, the old ones kept."
    import matplotlib; matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from types import SimpleNamespace
    from dpm.cli import _write_figures
    from test_hostile_files import FullDisk
    def figures(*a):
        fig, ax = plt.subplots(); ax.plot([0, 1], [1, 0]); return {'figure1': fig}
    exp = SimpleNamespace(name='toy', figures=figures)
    history = [dict(step=1, heldout_bits=1.0), dict(step=2, heldout_bits=2.0)]
    assert _write_figures(exp, None, None, {}, None, history, tmp_path) == ['figure1.png', 'training.png']
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real = os.fdopen
    monkeypatch.setattr(os, 'fdopen', lambda fd, *a, **kw: FullDisk(real(fd, *a, **kw), 2000))
    with pytest.raises(OSError, match='No space left on device') as e:
        _write_figures(exp, None, None, {}, None, history, tmp_path)
    assert 'figure1.png' in str(e.value)
    monkeypatch.setattr(os, 'fdopen', real)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before      # no 0-byte figure, no temporary


def test_a_real_full_disk(trained, tmp_path):
    "A tmpfs just larger than the model: the second `dpm sample` finds the disk full (needs mount rights)."
    mnt = tmp_path / 'small'; mnt.mkdir()
    size = (trained / 'model.pt').stat().st_size + (64 << 10)
    if subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip('cannot mount a tmpfs here')
    try:
        (mnt / 'model.pt').write_bytes((trained / 'model.pt').read_bytes())
        main(['sample', 'swiss_roll', '--out', str(mnt), '-n', '10'])
        before = {p.name: p.read_bytes() for p in mnt.iterdir()}
        exits(lambda: main(['sample', 'swiss_roll', '--out', str(mnt), '-n', '50000']),
              'samples.pt', 'No space left on device')
        assert {p.name: p.read_bytes() for p in mnt.iterdir()} == before
    finally:
        subprocess.run(['umount', str(mnt)], capture_output=True)


# 3. which data: said, recorded, never a silent stand-in ------------------------------------------------
def test_each_run_says_and_records_its_data(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv('DPM_SMALL', '1')
    main(['train', 'swiss_roll', '--out', str(tmp_path), '--set', 'steps=3', '--set', 'T=10', '--no-progress'])
    assert 'data: swiss_roll: not recorded' in capsys.readouterr().out
    rec = json.loads((tmp_path / 'training.json').read_text())
    assert rec['data'] == [dict(name='swiss_roll', stand_in=None,
                                source='not recorded (the experiment names no data record)')]


@pytest.mark.parametrize('how', ['fifo', 'directory'])
def test_a_broken_cifar_batch_under_dpm_data_stops_training(tmp_path, fresh_data, monkeypatch, how):
    d = cifar_dir(tmp_path)
    (d / 'data_batch_5').unlink()
    os.mkfifo(d / 'data_batch_5') if how == 'fifo' else (d / 'data_batch_5').mkdir()
    monkeypatch.setenv('DPM_DATA', str(tmp_path))
    with within(60):
        exits(lambda: main(['train', 'cifar10', '--out', str(tmp_path / 'o'), '--no-progress']),
              'data_batch_5', 'named pipe' if how == 'fifo' else 'is a directory')
    assert not (tmp_path / 'o' / 'model.pt').exists()


def test_stand_in_provenance_is_said(tmp_path, fresh_data, capsys, monkeypatch):
    "Without DPM_DATA the CIFAR-10 experiment names its stand-in on the terminal and in training.json."
    monkeypatch.delenv('DPM_DATA', raising=False)
    import dpm.cifar10 as C
    from dpm.experiments import data_records, describe_data
    recs = data_records(C.CIFAR10, C.CIFAR10.resolve(), 0)
    assert [(r['split'], r['stand_in']) for r in recs] == [('train', True), ('test', True),
                                                           ('valid', True)]
    assert "a stand-in, not the paper's data" in describe_data(recs[0])
    assert 'photo-patch stand-in (not CIFAR-10)' in describe_data(recs[0])


@pytest.mark.parametrize('exp, setting, words', [
    ('cifar10', 'covariance=full', "covariance must be one of ('diagonal', 'eigen')"),
    ('mnist', 'variant=foo', "variant must be one of ('paper', 'reference')"),
    ('cifar10', 'patience=-1', 'patience must be an integer >= 0'),
])
def test_settings_a_model_refuses_are_one_line(tmp_path, exp, setting, words):
    "A --set value that only the model's constructor can judge still ends in one line, code 1."
    r = dpm('train', exp, '--small', '--set', setting, '--out', str(tmp_path / 'o'), '--no-progress')
    one_line(r, words, code=1)
    assert not (tmp_path / 'o' / 'model.pt').exists()


# the refusals a re-run of hostile inputs still found as tracebacks or muddled lines -----------------
def test_a_model_with_nan_weights_is_one_line(trained, tmp_path, monkeypatch):
    "A model file with a valid checksum and a NaN weight: evaluate, sample and --init refuse it."
    monkeypatch.setenv('DPM_SMALL', '1')
    ck = {k: v for k, v in torch.load(trained / 'model.pt', weights_only=True).items() if k != 'checksum'}
    name = next(k for k, v in ck['model'].items() if v.is_floating_point() and v.numel() > 1)
    ck['model'][name] = ck['model'][name].clone(); ck['model'][name].view(-1)[0] = float('nan')
    atomic_save(ck, tmp_path / 'model.pt')
    for cmd in (['evaluate'], ['sample', '-n', '2']):
        exits(lambda: main([cmd[0], 'swiss_roll', '--out', str(tmp_path), *cmd[1:]]),
              'model.pt holds NaN or inf weights', name)
    exits(lambda: main(['train', 'swiss_roll', '--out', str(tmp_path / 'w'), '--init',
                        str(tmp_path / 'model.pt')]), 'NaN or inf weights')


def test_a_model_file_where_a_checkpoint_belongs_is_one_line(trained, tmp_path, monkeypatch):
    monkeypatch.setenv('DPM_SMALL', '1')
    (tmp_path / 'checkpoint.pt').write_bytes((trained / 'model.pt').read_bytes())
    exits(lambda: main(['train', 'swiss_roll', '--out', str(tmp_path)]),
          'checkpoint.pt is a model file, not a training checkpoint', '--init')


def test_an_empty_held_out_split_is_one_line(trained, tmp_path, monkeypatch):
    from dpm.swiss_roll import SWISS_ROLL
    monkeypatch.setenv('DPM_SMALL', '1')
    data = SWISS_ROLL.data
    monkeypatch.setattr(SWISS_ROLL, 'data', lambda cfg, seed: (data(cfg, seed)[0], torch.zeros(0, 2)))
    exits(lambda: main(['evaluate', 'swiss_roll', '--out', str(trained)]),
          "held-out split has no examples")


def test_an_empty_out_is_refused_and_wrapped_messages_say_dpm_once(capsys):
    with pytest.raises(SystemExit) as e: main(['sample', 'swiss_roll', '--out', '', '-n', '2'])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "--out: must name a directory" in err, err
    from dpm.cli import one_line as said
    assert said(CheckpointError("x.pt holds a configuration (dpm: T must be >= 3)")) == \
        'dpm: x.pt holds a configuration (T must be >= 3)'


def test_a_foreign_pickle_names_no_pytorch_internals(tmp_path):
    import zipfile, io
    buf = io.BytesIO(); torch.save({'format': 'dpm-checkpoint-2', 'x': np.float64(1.0)}, buf)
    (tmp_path / 'model.pt').write_bytes(buf.getvalue())
    msg = exits(lambda: main(['evaluate', 'swiss_roll', '--out', str(tmp_path)]),
                'is corrupt or not a dpm checkpoint')
    assert 'Weights only' not in msg and 'Error' not in msg, msg
