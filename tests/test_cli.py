"""The `dpm` console script: help texts, a small end-to-end run, clear errors, and resume after a real kill."""
import json, os, signal, subprocess, sys, time
from pathlib import Path
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, 'DPM_SMALL': '1', 'MPLBACKEND': 'Agg', 'OMP_NUM_THREADS': '1'}


def dpm(*args, check=True, **kw):
    r = subprocess.run([sys.executable, '-c', 'from dpm.cli import main; main()', *args], capture_output=True, text=True,
                       cwd=ROOT, **{'env': ENV, **kw})
    if check and r.returncode != 0: raise AssertionError(f'dpm {" ".join(args)} failed:\n{r.stdout}\n{r.stderr}')
    return r


def test_help_reads_well():
    out = dpm('--help').stdout
    for word in ('train', 'evaluate', 'sample', 'list', 'Example'): assert word in out
    for sub in ('train', 'evaluate', 'sample'):
        h = dpm(sub, '--help').stdout
        assert '--out' in h and '--device' in h and 'EXPERIMENT' in h


def test_list():
    out = dpm('list').stdout
    assert 'heartbeat' in out and 'swiss_roll' in out


def test_train_evaluate_sample(tmp_path):
    dpm('train', 'swiss_roll', '--out', str(tmp_path), '--set', 'steps=40', '--set', 'T=10', '--set', 'eval_every=20',
        '--no-progress')
    dpm('evaluate', 'swiss_roll', '--out', str(tmp_path))
    dpm('sample', 'swiss_roll', '--out', str(tmp_path), '-n', '300')
    rec = json.loads((tmp_path / 'record.json').read_text())
    n = rec['numbers']
    assert rec['seed'] == 0 and rec['config']['T'] == 10 and rec['machine']['python'] and rec['time']
    assert n['gap_bits'] >= -5 * n['gap_bits_se']                 # K never above the true log-likelihood
    assert torch.load(tmp_path / 'samples.pt').shape == (300, 2) and (tmp_path / 'samples.png').stat().st_size > 0
    assert set(rec['figures']) == {'figure1.png', 'training.png'}           # Figure 1 and the held-out bound
    assert all((tmp_path / f).stat().st_size > 0 for f in rec['figures'])


def test_clear_errors(tmp_path):
    r = dpm('train', 'nope', '--out', str(tmp_path), check=False)
    assert r.returncode != 0 and 'unknown experiment' in r.stderr and 'Traceback' not in r.stderr
    r = dpm('train', 'heartbeat', '--out', str(tmp_path), '--set', 'no_key=1', check=False)
    assert r.returncode != 0 and 'unknown configuration keys' in r.stderr and 'Traceback' not in r.stderr
    no_models = {**ENV, 'DPM_ROOT': str(tmp_path / 'no-checkout')}   # no committed model to fall back on
    r = dpm('evaluate', 'heartbeat', '--out', str(tmp_path), check=False, env=no_models)
    assert r.returncode != 0 and 'no trained model' in r.stderr
    (tmp_path / 'model.pt').write_bytes(b'\x00' * 100)
    r = dpm('evaluate', 'heartbeat', '--out', str(tmp_path), check=False)
    assert r.returncode != 0 and 'corrupt' in r.stderr and 'Traceback' not in r.stderr


def test_mismatched_checkpoint(tmp_path):
    dpm('train', 'heartbeat', '--out', str(tmp_path), '--set', 'steps=20', '--set', 'T=30', '--no-progress')
    r = dpm('train', 'heartbeat', '--out', str(tmp_path), '--set', 'steps=40', '--set', 'T=31', '--no-progress', check=False)
    assert r.returncode != 0 and 'different model' in r.stderr and 'Traceback' not in r.stderr
    r = dpm('train', 'heartbeat', '--out', str(tmp_path), '--set', 'steps=40', '--set', 'T=30', '--set', 'lr=0.1',
            '--no-progress', check=False)
    assert r.returncode != 0 and 'another configuration' in r.stderr


def test_kill_and_resume(tmp_path):
    "SIGKILL the console script after its first checkpoint; rerunning resumes and ends where an uninterrupted run ends."
    args = ['train', 'swiss_roll', '--set', 'steps=800', '--set', 'T=10', '--set', 'checkpoint_every=100',
            '--set', 'eval_every=0', '--no-progress']
    a, b = tmp_path / 'a', tmp_path / 'b'
    p = subprocess.Popen([sys.executable, '-c', 'from dpm.cli import main; main()', *args, '--out', str(a)], cwd=ROOT, env=ENV)
    while not (a / 'checkpoint.pt').exists() and p.poll() is None: time.sleep(0.02)
    p.send_signal(signal.SIGKILL); p.wait()
    from dpm.training import load_checkpoint
    killed = load_checkpoint(a / 'checkpoint.pt')['step']
    assert 0 < killed < 800 and not (a / 'model.pt').exists()
    dpm(*args, '--out', str(a)); dpm(*args, '--out', str(b))
    ma, mb = torch.load(a / 'model.pt', weights_only=True), torch.load(b / 'model.pt', weights_only=True)
    assert ma['info']['steps'] == mb['info']['steps'] == 800
    for k in ma['model']: assert torch.allclose(ma['model'][k], mb['model'][k], atol=1e-6), k


def test_python_m_dpm_is_dpm():
    for mod in ('dpm', 'dpm.cli'):
        r = subprocess.run([sys.executable, '-m', mod, 'list'], capture_output=True, text=True, cwd=ROOT, env=ENV)
        assert r.returncode == 0 and 'swiss_roll' in r.stdout, (mod, r.stderr)
    r = subprocess.run([sys.executable, '-m', 'dpm.cli'], capture_output=True, text=True, cwd=ROOT, env=ENV)
    assert r.returncode == 2 and 'COMMAND' in r.stderr                  # not a silent exit 0


@pytest.fixture
def image_toy(monkeypatch):
    "Register tests/image_toy.py's experiment with the CLI (in this process)."
    import dpm.cli
    monkeypatch.syspath_prepend(str(ROOT / 'tests'))
    monkeypatch.setattr(dpm.cli, 'EXPERIMENT_MODULES', dpm.cli.EXPERIMENT_MODULES + ('image_toy',))
    return dpm.cli.main


@pytest.mark.parametrize('channels', [1, 3])
def test_image_experiment_trains_with_bf16_and_channels_last_and_samples_a_grid(tmp_path, image_toy, channels):
    from PIL import Image
    main = image_toy
    main(['train', 'image_toy', '--out', str(tmp_path), '--set', f'channels={channels}', '--set', 'amp="bf16"',
          '--set', 'channels_last=true', '--set', 'checkpoint_minutes=0.5', '--no-progress'])
    info = torch.load(tmp_path / 'model.pt', weights_only=True)['info']
    assert info['precision'] == 'bf16' and info['channels_last'] and info['world_size'] == 1
    assert info['examples_per_second'] > 0 and info['peak_memory_mb'] > 0 and info['completed']
    rec = json.loads((tmp_path / 'training.json').read_text())
    assert rec['device'] == 'cpu' and rec['precision'] == 'bf16'
    main(['sample', 'image_toy', '--out', str(tmp_path), '-n', '10'])
    img = Image.open(tmp_path / 'samples.png')
    assert torch.load(tmp_path / 'samples.pt').shape == (10, channels, 8, 8)
    # 4 columns x 3 rows of 8x8 images with 1-pixel gaps, enlarged by an integer factor to >= 512 pixels
    w, h = 4 * 9 + 1, 3 * 9 + 1
    s = -(-512 // w)
    assert img.size == (w * s, h * s) and w * s >= 512


def test_image_grid_layout():
    from dpm.cli import image_grid
    x = torch.zeros(5, 3, 4, 6); x[1] = 1.0
    g = image_grid(x, pad=1, min_size=1)
    assert g.shape == (2 * 5 + 1, 3 * 7 + 1, 3) and g.min() >= 0 and g.max() <= 1
    assert (g[1:5, 8:14] == 1).all() and (g[1:5, 1:7] == 0).all()        # image 1 white, image 0 black
    with pytest.raises(ValueError, match='C = 1 or 3'): image_grid(torch.zeros(2, 2, 4, 4))


def test_a_closed_pipe_is_not_a_traceback():
    "`dpm list | head -1`: the reader leaves early; dpm exits quietly (no BrokenPipeError traceback)."
    import subprocess, sys
    r = subprocess.run(f"{sys.executable} -m dpm list | head -1", shell=True, capture_output=True,
                       text=True)
    assert r.stdout.count('\n') == 1 and 'Traceback' not in r.stderr, r.stderr
