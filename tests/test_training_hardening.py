"""Issue 11: every way of misusing `dpm train/evaluate/sample` or a model file ends in one clear `dpm:` line
(or a correct result), never a traceback, a silent success or a silently wrong model."""
import json, os, signal, subprocess, sys, time, zipfile
from pathlib import Path
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, 'DPM_SMALL': '1', 'MPLBACKEND': 'Agg', 'OMP_NUM_THREADS': '1'}
QUICK = ['--set', 'steps=20', '--set', 'T=10', '--set', 'eval_every=0', '--no-progress']


def dpm(*args, check=True, **kw):
    "Run the console script in a subprocess."
    r = subprocess.run([sys.executable, '-m', 'dpm', *args], capture_output=True, text=True, cwd=ROOT, env=ENV, **kw)
    if check and r.returncode != 0: raise AssertionError(f'dpm {" ".join(args)} failed:\n{r.stdout}\n{r.stderr}')
    return r


def refused(r, *words):
    "Exit status non-zero, one `dpm:` line naming `words`, no traceback."
    assert r.returncode != 0, r.stdout
    assert 'Traceback' not in r.stderr and r.stderr.strip().startswith('dpm:'), r.stderr
    for w in words: assert w in r.stderr, (w, r.stderr)


def exits(f, *words):
    with pytest.raises(SystemExit) as e: f()
    assert str(e.value).startswith('dpm:') and all(w in str(e.value) for w in words), str(e.value)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp('trained')
    dpm('train', 'swiss_roll', '--out', str(out), *QUICK)
    return out


# 1. one run per output directory -----------------------------------------------------------------------
def test_out_dir_is_owned_by_one_run(tmp_path):
    long = ['train', 'swiss_roll', '--out', str(tmp_path), '--set', 'steps=100000', '--set', 'T=10',
            '--set', 'eval_every=0', '--no-progress']
    p = subprocess.Popen([sys.executable, '-m', 'dpm', *long], cwd=ROOT, env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        lock = tmp_path / '.lock'
        while p.poll() is None and not (lock.exists() and lock.read_text().startswith('pid')): time.sleep(0.05)
        refused(dpm(*long, check=False), 'in use by another training run', f'pid {p.pid}')
    finally:
        p.send_signal(signal.SIGKILL); p.wait()
    dpm('train', 'swiss_roll', '--out', str(tmp_path), '--set', 'steps=100000', '--set', 'T=10', '--set',
        'eval_every=0', '--set', 'max_minutes=0.001', '--no-progress')         # killed: no stale lock


# 2. every configuration key checked before any work ---------------------------------------------------
@pytest.mark.parametrize('kv, words', [
    ('ema=1', ['ema=1', '(0, 1)']), ('lr_final=-5', ['lr_final=-5', '[0, 1]']),
    ('steps=2.5', ['steps=2.5', 'an integer >= 1']), ('steps=true', ['steps=true', 'an integer']),
    ('lr=NaN', ['lr=NaN', 'finite number > 0']), ('lr=nan', ['lr="nan"', 'finite number']),
    ('eval_size=0', ['eval_size=0', '>= 1']), ('n_heldout=0', ['n_heldout=0', '>= 1']),
    ('stratified=1', ['stratified=1', 'true or false']), ('learn_schedule=0', ['learn_schedule', 'true or false']),
    ('optimizer="sgd"', ['optimizer', "'adam', 'rmsprop'"]), ('amp="fp16"', ['amp', "'bf16'"]),
    ('max_minutes=0', ['max_minutes=0', '> 0']), ('noise=-1', ['noise=-1', '> 0']), ('T=2', ['T=2', '>= 3']),
    ('T=1', ['T=1', '>= 3']), ('model=3', ['model=3', 'a str'])])
def test_bad_values_are_refused_before_work(tmp_path, kv, words, monkeypatch):
    from dpm.cli import main
    monkeypatch.setenv('DPM_SMALL', '1')
    exits(lambda: main(['train', 'swiss_roll', '--out', str(tmp_path / 'o'), '--set', kv]), *words)
    assert not (tmp_path / 'o').exists()                                      # nothing written


def test_bad_value_in_a_subprocess_is_one_line(tmp_path):
    refused(dpm('train', 'swiss_roll', '--out', str(tmp_path), '--set', 'ema=1', check=False), 'ema=1', '(0, 1)')


def test_unknown_keys_still_fail_and_any_train_key_can_be_set(tmp_path):
    refused(dpm('train', 'heartbeat', '--out', str(tmp_path), '--set', 'no_key=1', check=False),
            'unknown configuration keys')
    from dpm.swiss_roll import SWISS_ROLL
    assert 'max_minutes' not in SWISS_ROLL.config                              # not listed, yet settable
    cfg = SWISS_ROLL.resolve({'max_minutes': 5, 'amp': 'bf16', 'channels_last': True, 'checkpoint_minutes': 1.5})
    assert cfg['max_minutes'] == 5 and cfg['amp'] == 'bf16' and cfg['compile'] is False


# 3. checksums -------------------------------------------------------------------------------------------
def _flip_a_weight_byte(path):
    "Flip one byte inside a tensor's storage of a torch.save zip file (the zip stays readable)."
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if '/data/' in i.filename), key=lambda i: i.file_size)
    raw = bytearray(Path(path).read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    raw[start + info.file_size // 2] ^= 0x10
    Path(path).write_bytes(bytes(raw))


def test_flipped_bytes_are_detected(trained, tmp_path):
    bad = tmp_path / 'model.pt'; bad.write_bytes((trained / 'model.pt').read_bytes())
    _flip_a_weight_byte(bad)
    torch.load(bad, weights_only=True)                                          # torch itself does not notice
    from dpm.checkpoints import CheckpointError
    from dpm.training import load_checkpoint
    with pytest.raises(CheckpointError, match='checksum'): load_checkpoint(bad)
    refused(dpm('evaluate', 'swiss_roll', '--out', str(tmp_path), check=False), 'checksum')


def test_old_files_without_checksum_are_refused_and_can_be_upgraded(trained, tmp_path, monkeypatch):
    from dpm.cli import main
    monkeypatch.setenv('DPM_SMALL', '1')
    old = torch.load(trained / 'model.pt', weights_only=True)
    old['format'] = 'dpm-checkpoint-1'; del old['checksum']
    torch.save(old, tmp_path / 'model.pt')
    exits(lambda: main(['sample', 'swiss_roll', '--out', str(tmp_path), '-n', '10']), 'dpm upgrade')
    main(['upgrade', str(tmp_path / 'model.pt')])
    new = torch.load(tmp_path / 'model.pt', weights_only=True)
    assert new['format'] == 'dpm-checkpoint-2' and all(torch.equal(new['model'][k], old['model'][k]) for k in old['model'])
    main(['sample', 'swiss_roll', '--out', str(tmp_path), '-n', '10'])


def test_committed_models_carry_checksums():
    from dpm.checkpoints import checksum, _read
    from dpm.training import load_checkpoint
    for f in sorted((ROOT / 'results' / 'models').glob('*.pt')):
        if f.name == 'digit_classifier.pt':      # not a diffusion model: its own kind, same checksum
            obj = _read(f)[0]; assert obj['checksum'] == checksum(obj)
        else: assert load_checkpoint(f)['checksum']


def test_a_classifier_is_not_taken_for_a_diffusion_model():
    from dpm.checkpoints import CheckpointError
    from dpm.training import load_checkpoint
    with pytest.raises(CheckpointError, match='unknown kind'):
        load_checkpoint(ROOT / 'results' / 'models' / 'digit_classifier.pt')


# 4. T = 1 and T = 2 ---------------------------------------------------------------------------------
def test_too_short_trajectories_are_refused_by_the_cli(tmp_path, monkeypatch):
    "T = 1 trained and then crashed in evaluate; T = 2 failed with NaN: both refused up front, for every command."
    from dpm.cli import main
    monkeypatch.setenv('DPM_SMALL', '1')
    for name in ('heartbeat', 'swiss_roll'):
        for T in (1, 2):
            exits(lambda: main(['train', name, '--out', str(tmp_path / 'o'), '--set', f'T={T}']), f'T={T}', '>= 3')
    assert not (tmp_path / 'o').exists()


# 5. python -m dpm.cli ------------------------------------------------------------------------------------
def test_python_m_dpm_cli_runs(tmp_path):
    r = subprocess.run([sys.executable, '-m', 'dpm.cli', 'train', 'swiss_roll', '--out', str(tmp_path), *QUICK],
                       capture_output=True, text=True, cwd=ROOT, env=ENV)
    assert r.returncode == 0 and (tmp_path / 'model.pt').exists(), r.stderr


# 6. devices, --out, read-only directories ----------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason='needs a machine without CUDA')
def test_cuda_on_a_cpu_machine(tmp_path):
    from dpm.cli import main
    for cmd in ('train', 'evaluate', 'sample'):
        exits(lambda: main([cmd, 'swiss_roll', '--out', str(tmp_path), '--device', 'cuda']), '--device', 'cuda')
    exits(lambda: main(['train', 'swiss_roll', '--out', str(tmp_path), '--device', 'nonsense']), 'unknown device')
    refused(dpm('train', 'swiss_roll', '--out', str(tmp_path), '--device', 'cuda:0', check=False), 'no CUDA')


def test_out_naming_a_file(tmp_path):
    f = tmp_path / 'file'; f.write_text('x')
    refused(dpm('train', 'swiss_roll', '--out', str(f), *QUICK, check=False), 'is a file')


def test_bad_config_file(tmp_path):
    (tmp_path / 'c.json').write_text('[1, 2]')
    refused(dpm('train', 'swiss_roll', '--out', str(tmp_path), '--config', str(tmp_path / 'c.json'), check=False),
            'JSON object')


@pytest.fixture
def read_only(tmp_path, monkeypatch):
    """A directory this process cannot write: mode 0555; as root (which ignores modes) creating files there is
    also made to fail with EACCES, as it would for anybody else."""
    d = tmp_path / 'ro'; d.mkdir()
    if os.geteuid() == 0:
        import tempfile
        real = tempfile.TemporaryFile
        def denied(*a, dir=None, **kw):
            if dir is not None and Path(dir).resolve() == d.resolve(): raise PermissionError(13, 'Permission denied')
            return real(*a, dir=dir, **kw)
        monkeypatch.setattr(tempfile, 'TemporaryFile', denied)
    yield d
    os.chmod(d, 0o755)


def test_read_only_out_dir_for_train(read_only, monkeypatch):
    from dpm.cli import main
    monkeypatch.setenv('DPM_SMALL', '1')
    os.chmod(read_only, 0o555)
    exits(lambda: main(['train', 'swiss_roll', '--out', str(read_only), *QUICK]), 'cannot write', 'Permission denied')


def test_read_only_out_dir_for_evaluate_fails_before_the_work(trained, read_only, monkeypatch):
    from dpm.cli import main
    from dpm.swiss_roll import SWISS_ROLL
    monkeypatch.setenv('DPM_SMALL', '1')
    (read_only / 'model.pt').write_bytes((trained / 'model.pt').read_bytes())
    os.chmod(read_only, 0o555)
    calls = []
    monkeypatch.setattr(SWISS_ROLL, 'evaluate', lambda *a: calls.append(1) or {})
    exits(lambda: main(['evaluate', 'swiss_roll', '--out', str(read_only)]), 'cannot write')
    exits(lambda: main(['sample', 'swiss_roll', '--out', str(read_only), '-n', '10']), 'cannot write')
    assert not calls and not (read_only / 'record.json').exists()


# 7. Ctrl-C ------------------------------------------------------------------------------------------
def test_ctrl_c_says_where_to_resume(tmp_path):
    args = ['train', 'swiss_roll', '--out', str(tmp_path), '--set', 'steps=100000', '--set', 'T=10',
            '--set', 'checkpoint_every=20', '--set', 'eval_every=0', '--no-progress']
    # a shell that starts a job in the background makes it ignore SIGINT, and Python keeps an
    # ignored SIGINT: give the child the default disposition, as an interactive terminal would
    p = subprocess.Popen([sys.executable, '-m', 'dpm', *args], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while not (tmp_path / 'checkpoint.pt').exists() and p.poll() is None: time.sleep(0.05)
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert 'Traceback' not in err and len(err.strip().splitlines()) == 1, err
    from dpm.training import load_checkpoint
    step = load_checkpoint(tmp_path / 'checkpoint.pt')['step']
    assert f'holds step {step}' in err and 'resume' in err and str(tmp_path / 'checkpoint.pt') in err


# 8. hostile model files ------------------------------------------------------------------------------
def test_enormous_layers_are_refused_before_allocating(trained, tmp_path):
    from dpm.checkpoints import atomic_save, CheckpointError
    from dpm.experiments import load_model
    from dpm.swiss_roll import SWISS_ROLL
    ck = torch.load(trained / 'model.pt', weights_only=True)
    ck['config'] = {**ck['config'], 'width': 8192}               # 8192^2 weights per hidden layer; tensors stay small
    del ck['checksum']; atomic_save(ck, tmp_path / 'model.pt')  # a valid checksum: integrity is not authenticity
    with pytest.raises(CheckpointError, match='refusing to build'): load_model(SWISS_ROLL, tmp_path / 'model.pt')
    from dpm.cli import main
    exits(lambda: main(['evaluate', 'swiss_roll', '--out', str(tmp_path)]), 'refusing to build')


def test_lying_signature_is_refused(trained, tmp_path):
    from dpm.checkpoints import atomic_save, CheckpointError
    from dpm.experiments import load_model
    from dpm.swiss_roll import SWISS_ROLL
    ck = torch.load(trained / 'model.pt', weights_only=True)
    k = next(k for k, v in ck['model'].items() if v.ndim == 2)
    ck['model'][k] = torch.zeros(3, 3)                           # the stored signature still claims the old shape
    del ck['checksum']; atomic_save(ck, tmp_path / 'model.pt')
    with pytest.raises(CheckpointError, match='different model'): load_model(SWISS_ROLL, tmp_path / 'model.pt')


# 9. mixed devices -----------------------------------------------------------------------------------
def test_mixed_devices():
    from dpm.training import evaluate_bound
    from dpm.diffusion import GaussianDiffusion, GaussianSchedule
    from dpm.reverse import MLPReverse
    d = GaussianDiffusion(GaussianSchedule(5)); rev = MLPReverse(d, width=8, depth=2)
    x = torch.randn(10, 2)
    assert evaluate_bound(d, rev, x, batch_size=3)['n'] == 10
    with pytest.raises(ValueError, match='diffusion is on cpu but the reverse model on meta'):
        evaluate_bound(d, rev.to('meta'), x)
    with pytest.raises(ValueError, match='at least one example'): evaluate_bound(d, MLPReverse(d, 8, 8), x[:0])
    if torch.cuda.is_available():                                 # the GPU half: data on the CPU is moved
        d2, rev2 = d.to('cuda'), MLPReverse(d, width=8, depth=2).to('cuda')
        assert evaluate_bound(d2, rev2, x)['n'] == 10
        with pytest.raises(ValueError, match='diffusion is on cuda'): evaluate_bound(d2, rev2.cpu(), x)


def test_patience_stops_and_a_rerun_stays_stopped(tmp_path, monkeypatch):
    "eq-train-stop: a scripted held-out history stops the run two evaluations past its peak."
    import dpm.training as tr
    from dpm.diffusion import GaussianDiffusion, GaussianSchedule
    from dpm.reverse import MLPReverse
    script = iter([1.0, 3.0, 2.0, 2.5, 9.0, 9.0])
    def fake_eval(state, heldout, seed):
        state.history.append(dict(step=state.step, heldout_bits=next(script)))
        return state.history[-1]['heldout_bits']
    monkeypatch.setattr(tr, '_held_out_eval', fake_eval)
    d = GaussianDiffusion(GaussianSchedule(5, learn=False))
    rev = MLPReverse(d, width=8, depth=2)
    x = torch.randn(64, 2)
    cfg = tr.TrainConfig(steps=100, batch_size=8, eval_every=5, patience=2, checkpoint_every=5)
    info = tr.train(d, rev, x, x[:8], cfg, checkpoint=tmp_path / 'ck.pt', progress=False)
    assert info['steps'] == 20 and info['stopped_early']
    again = tr.train(d, rev, x, x[:8], cfg, checkpoint=tmp_path / 'ck.pt', progress=False)
    assert again['steps'] == 20
