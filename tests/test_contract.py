"""The public contract of the core (issue 2, section 2), exercised as a user would: import the
package, build both diffusions, and call every documented method on data of several shapes."""
import ast
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dpm.diffusion import (BinomialDiffusion, GaussianDiffusion, GaussianSchedule,
                           binomial_schedule, nats_to_bits)

DEVICES = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])


def gaussian_reverse(d):
    return lambda xt, t: d.kernel(xt, t)    # T_pi: the exact reverse for data distributed as pi


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('shape', [(5, 2), (3, 1, 4, 4)])
def test_gaussian_contract(device, shape):
    d = GaussianDiffusion(torch.linspace(1e-3, 0.3, 20)).to(device)
    assert d.T == 20
    x0 = torch.randn(shape, device=device)
    t = torch.randint(1, d.T + 1, (shape[0],), device=device)
    assert d.q_sample(x0, t).shape == shape
    mean, var = d.q_posterior(x0, d.q_sample(x0, t), t)
    assert mean.shape == shape and var.shape == shape and (var >= 0).all()
    rev = gaussian_reverse(d)
    for value in (d.bound(rev, x0), d.bound_estimate(rev, x0), d.log_likelihood(rev, x0, n=3)):
        assert value.shape == (shape[0],) and torch.isfinite(value).all()
    assert d.sample(rev, shape).shape == shape
    lower, upper = d.entropy_bounds(x0)
    assert lower.shape == upper.shape == (d.T,) and (lower[1:] <= upper[1:]).all()


@pytest.mark.parametrize('device', DEVICES)
def test_binomial_contract(device):
    d = BinomialDiffusion(binomial_schedule(30), p=0.2).to(device)
    x0 = (torch.rand(6, 20, device=device) < 0.2).float()
    rev = lambda xt, t: d.kernel(xt, t)
    t = torch.randint(1, d.T + 1, (6,), device=device)
    prob = d.q_posterior(x0, d.q_sample(x0, t), t)
    assert ((prob >= 0) & (prob <= 1)).all()
    K = d.bound(rev, x0)
    ll = d.log_likelihood(rev, x0, n=1)
    log_pi = d.log_prob(x0, d.stationary(x0))
    assert torch.allclose(ll, log_pi, atol=1e-4)          # quasi-static: one trajectory is exact
    assert torch.isfinite(K).all()
    samples = d.sample(rev, (4000, 20))
    assert set(samples.unique().tolist()) <= {0.0, 1.0}
    assert abs(samples.mean().item() - 0.2) < 0.02


def test_learned_schedule_trains_through_the_bound():
    sched = GaussianSchedule(10, n_bumps=4)
    d = GaussianDiffusion(sched)
    x0 = torch.randn(64, 2) * 0.3
    rev = lambda xt, t: d.kernel(xt, t)
    d.bound_estimate(rev, x0).mean().backward()
    assert sched.weights.grad is not None and torch.isfinite(sched.weights.grad).all()


def test_units():
    d = GaussianDiffusion(torch.full((5,), 0.1))
    assert math.isclose(nats_to_bits(d.l_null((2,))), -math.log2(2 * math.pi * math.e))


G4 = lambda: GaussianDiffusion(torch.full((4,), 0.1))
B4 = lambda: BinomialDiffusion(binomial_schedule(4))


@pytest.mark.parametrize('bad, message', [
    (lambda: GaussianDiffusion(torch.tensor([0.5, 0.0])), '(0, 1]'),
    (lambda: GaussianDiffusion(torch.tensor([0.5, float('inf')])), 'NaN or inf'),
    (lambda: BinomialDiffusion(binomial_schedule(4), p=0.0), '(0, 1)'),
    (lambda: B4().bound(lambda x, t: x, torch.full((2, 3), 0.5)), 'binary'),
    (lambda: G4().q_sample(torch.zeros(2, 3), torch.tensor([1, 5])), '1..4'),
    (lambda: G4().q_sample(torch.zeros(2, 3), torch.tensor([1.0, 2.0])), 'integer'),
    (lambda: G4().q_step(torch.zeros(2, 3), torch.tensor([0, 1])), '1..4'),
    (lambda: G4().bound(lambda x, t: (x.numpy(), x.numpy()), torch.zeros(2, 3)), 'torch tensors'),
    (lambda: G4().bound(lambda x, t: (x, x + 1), torch.zeros(2, 3), n_samples=0), 'n_samples'),
])
def test_bad_input_is_refused_clearly(bad, message):
    with pytest.raises((ValueError, TypeError), match=None) as info:
        bad()
    assert message in str(info.value)


# The import circle (issue 12): the chapters after 01 add methods to the diffusion classes with
# @patch; the package's __init__ loads them, so dpm.diffusion itself imports none of them.
ROOT = Path(__file__).resolve().parents[1]
EXTENDING = {'bound', 'entropy', 'posterior'}


def _imported_modules(path):
    """Every module an `import` statement in `path` names, relative ones with their dots."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import): names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = '.' * node.level + (node.module or '')
            names.add(base)
            names |= {f'{base}.{a.name}' if node.module else base + a.name for a in node.names}
    return names


def test_diffusion_imports_none_of_the_modules_that_extend_it():
    imported = _imported_modules(ROOT / 'dpm' / 'diffusion.py')
    circle = {n for n in imported if n.split('.')[-1] in EXTENDING}
    assert not circle, f'dpm/diffusion.py imports {sorted(circle)}: the import circle is back'


def test_importing_dpm_diffusion_alone_gives_the_complete_classes():
    """A fresh interpreter that imports only dpm.diffusion still gets the later chapters' methods."""
    code = textwrap.dedent('''
        import torch
        from dpm.diffusion import GaussianDiffusion, BinomialDiffusion
        d = GaussianDiffusion(torch.full((4,), 0.1))
        K = d.bound(lambda xt, t: d.kernel(xt, t), torch.randn(3, 2))
        assert K.shape == (3,) and torch.isfinite(K).all()
        for cls in (GaussianDiffusion, BinomialDiffusion):
            for name in ('bound', 'bound_terms', 'bound_estimate', 'bound_simplified',
                         'log_likelihood', 'sample', 'entropy_bounds', 'sample_posterior'):
                assert callable(getattr(cls, name)), (cls.__name__, name)
    ''')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
    out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
