"""Data-parallel training: `torchrun --nproc_per_node=2 -m dpm train` (gloo, CPU) ends where one process ends.

Every rank draws the same global minibatch, time steps and noise and takes its slice; DDP averages the
gradients, which is the gradient of the global batch mean. So two processes and one process with the
same global batch follow the same trajectory up to float rounding in the reduction order."""
import os, shutil, subprocess, sys
from pathlib import Path
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, 'DPM_SMALL': '1', 'MPLBACKEND': 'Agg', 'OMP_NUM_THREADS': '1'}
ARGS = ['train', 'swiss_roll', '--small', '--set', 'steps=40', '--set', 'T=10', '--set', 'eval_every=20',
        '--set', 'checkpoint_every=15', '--no-progress']
TOL = 1e-5            # observed: 5e-7 after 40 Adam steps (largest weight about 10)


def torchrun(*args, **kw):
    return subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                           '-m', 'dpm', *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.skipif(not torch.distributed.is_available(), reason='torch.distributed not built')
def test_two_processes_match_one_with_stop_and_resume(tmp_path):
    """One process, 40 steps; two processes stopped by max_minutes after a step or two, then resumed
    under torchrun to 40 steps: the same weights, the same held-out bound."""
    one, two = tmp_path / 'one', tmp_path / 'two'
    r = subprocess.run([sys.executable, '-m', 'dpm', *ARGS, '--out', str(one)], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    r = torchrun(*ARGS, '--set', 'max_minutes=0.0001', '--out', str(two))      # 6 ms: stops early
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count('stopped swiss_roll after max_minutes') == 1         # rank 0 alone reports
    stopped = torch.load(two / 'model.pt', weights_only=True)['info']
    ck = torch.load(two / 'checkpoint.pt', weights_only=True)
    assert stopped['stopped_early'] and not stopped['completed'] and 0 < stopped['steps'] == ck['step'] < 40
    r = torchrun(*ARGS, '--out', str(two))                                      # resume to the end
    assert r.returncode == 0, r.stdout + r.stderr
    a, b = (torch.load(p / 'model.pt', weights_only=True) for p in (one, two))
    assert a['info']['world_size'] == 1 and b['info']['world_size'] == 2
    assert a['info']['steps'] == b['info']['steps'] == 40 and b['info']['completed']
    for k in a['model']:
        assert torch.allclose(a['model'][k], b['model'][k], atol=TOL, rtol=0), k
    ha, hb = a['info']['history'], b['info']['history']
    assert [h['step'] for h in ha] == [h['step'] for h in hb] == [20]
    assert abs(ha[0]['heldout_bits'] - hb[0]['heldout_bits']) < 1e-4
    assert not list(two.glob('*.tmp'))                                          # atomic writes only
