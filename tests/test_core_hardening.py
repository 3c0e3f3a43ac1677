"""Hardening of the core (issue 11): short chains, empty batches, tiny betas, unchecked time steps,
reverse models that return the wrong kind of object, mixed devices. Each test failed on the code
before the fix."""
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from dpm.diffusion import BinomialDiffusion, GaussianDiffusion, GaussianSchedule, binomial_schedule

ROOT = Path(__file__).resolve().parents[1]


def kernel_reverse(d):
    return lambda xt, t: d.kernel(xt, t)


def steps(t, n):
    return torch.full((n,), t, dtype=torch.long)


# --- short chains -------------------------------------------------------------------------------

@pytest.mark.parametrize('T', [1, 2, 3, 4, 5])
@pytest.mark.parametrize('n_bumps', [1, 2, 10])
def test_gaussian_schedule_is_finite_for_every_T(T, n_bumps):
    betas = GaussianSchedule(T, n_bumps=n_bumps)()
    assert betas.shape == (T,)
    assert torch.isfinite(betas).all() and (betas > 0).all() and (betas < 1).all()


def test_gaussian_schedule_keeps_its_values_for_long_chains():
    # the fix for short chains must not change the schedules of trained models
    sched = GaussianSchedule(40, n_bumps=10)
    with torch.no_grad():
        sched.weights.copy_(torch.linspace(-1, 1, 10))
    centres = torch.linspace(2, 40, 10, dtype=torch.float64)
    t = torch.arange(1, 41, dtype=torch.float64)
    bumps = torch.exp(-0.5 * ((t[:, None] - centres[None]) / (centres[1] - centres[0])) ** 2)
    baseline = torch.logit(1.0 / torch.linspace(40, 2, 40, dtype=torch.float64)).float().double()
    expected = torch.sigmoid(baseline + bumps.float().double() @ torch.linspace(-1, 1, 10).double())
    assert torch.allclose(sched()[1:].detach(), expected[1:], rtol=1e-12, atol=0)


@pytest.mark.parametrize('T', [1, 2, 3])
def test_short_gaussian_chains_work(T):
    torch.manual_seed(0)
    for d in (GaussianDiffusion(GaussianSchedule(T)), GaussianDiffusion(torch.full((T,), 0.1))):
        x0 = torch.randn(5, 2)
        rev = kernel_reverse(d)
        for value in (d.bound(rev, x0), d.bound_estimate(rev, x0), d.log_likelihood(rev, x0, n=2),
                      d.bound_simplified(rev, x0)):
            assert value.shape == (5,) and torch.isfinite(value).all()
        assert d.sample(rev, (3, 2)).shape == (3, 2)
        lower, upper = d.entropy_bounds(x0)
        assert lower.shape == upper.shape == (T,)


def test_one_step_chain_is_exact():
    # T = 1: K is the prior term plus the first-step term, no reverse model involved
    d = GaussianDiffusion(torch.tensor([0.1], dtype=torch.float64))
    x0 = torch.randn(4, 3, dtype=torch.float64)
    never = lambda xt, t: pytest.fail('the reverse model must not be called when T = 1')
    prior, first, kls = d.bound_terms(never, x0)
    assert kls.shape == (4, 0)
    assert torch.allclose(d.bound(never, x0), prior + first)
    assert torch.allclose(d.bound_estimate(never, x0), prior + first)
    b = BinomialDiffusion(binomial_schedule(1), p=0.3)
    bits = (torch.rand(6, 4) < 0.3).float()
    log_pi = b.log_prob(bits, b.stationary(bits))
    assert torch.allclose(b.bound(never, bits), log_pi, atol=1e-5)
    assert torch.allclose(b.log_likelihood(never, bits, n=1), log_pi, atol=1e-5)


def test_schedule_module_with_nan_is_refused_at_construction():
    class Broken(torch.nn.Module):
        def forward(self): return torch.tensor([1e-3, float('nan')], dtype=torch.float64)
    with pytest.raises(ValueError, match='NaN'):
        GaussianDiffusion(Broken())


# --- empty batches ------------------------------------------------------------------------------

def test_empty_batches_give_empty_results():
    g = GaussianDiffusion(torch.linspace(1e-3, 0.3, 10))
    b = BinomialDiffusion(binomial_schedule(10), p=0.2)
    for d, x0 in ((g, torch.zeros(0, 3)), (b, torch.zeros(0, 3)), (g, torch.zeros(0, 1, 4, 4))):
        rev = kernel_reverse(d)
        for value in (d.bound(rev, x0), d.bound_estimate(rev, x0), d.log_likelihood(rev, x0, n=4),
                      d.bound_simplified(rev, x0)):
            assert value.shape == (0,)
        assert d.q_sample(x0, steps(3, 0)).shape == x0.shape
        prior, first, kls = d.bound_terms(rev, x0)
        assert prior.shape == first.shape == (0,) and kls.shape == (0, 9)


def test_binomial_entropy_bounds_refuse_an_empty_batch():
    b = BinomialDiffusion(binomial_schedule(10), p=0.2)
    with pytest.raises(ValueError, match='empty'):
        b.entropy_bounds(torch.zeros(0, 3))


@pytest.mark.parametrize('n', [0, -1])
def test_bound_refuses_no_samples(n):
    g = GaussianDiffusion(torch.linspace(1e-3, 0.3, 10))
    with pytest.raises(ValueError, match='n_samples'):
        g.bound(kernel_reverse(g), torch.zeros(2, 3), n_samples=n)


# --- betas near float64 resolution ---------------------------------------------------------------

def test_betas_below_float64_resolution():
    d = GaussianDiffusion(torch.full((10,), 5e-17, dtype=torch.float64))
    x0 = torch.randn(4, 2, dtype=torch.float64)
    _, var = d.marginal(x0, steps(10, 4))
    assert torch.allclose(var, torch.full_like(var, 5e-16), rtol=1e-9)
    rev = kernel_reverse(d)
    for value in (d.bound(rev, x0), d.bound_estimate(rev, x0), d.log_likelihood(rev, x0, n=2)):
        assert torch.isfinite(value).all()
    mean, var = d.q_posterior(x0, d.q_sample(x0, steps(5, 4)), steps(5, 4))
    assert torch.isfinite(mean).all() and torch.allclose(var, torch.full_like(var, 0.8 * 5e-17))


def test_tiny_first_beta_bound_and_estimate_agree():
    torch.manual_seed(0)
    d = GaussianDiffusion(torch.tensor([1e-17, .1, .1], dtype=torch.float64))
    x0 = torch.randn(3, 2, dtype=torch.float64)
    rev = kernel_reverse(d)
    full = torch.stack([d.bound(rev, x0) for _ in range(400)])
    est = torch.stack([d.bound_estimate(rev, x0) for _ in range(4000)])
    assert torch.isfinite(full).all() and torch.isfinite(est).all()
    se = (full.var(0) / len(full) + est.var(0) / len(est)).sqrt()
    assert ((full.mean(0) - est.mean(0)).abs() < 5 * se).all()


def test_betas_that_underflow_float32_are_refused():
    with pytest.raises(ValueError, match='float32'):
        GaussianDiffusion(torch.tensor([1e-45, 0.1], dtype=torch.float64))


# --- q_step checks its input --------------------------------------------------------------------

@pytest.mark.parametrize('t', [0, -1, 5])
def test_q_step_refuses_steps_outside_the_chain(t):
    d = GaussianDiffusion(torch.full((4,), 0.1))
    with pytest.raises(ValueError, match='1..4'):
        d.q_step(torch.zeros(2, 3), steps(t, 2))


def test_q_step_refuses_bad_data():
    g = GaussianDiffusion(torch.full((4,), 0.1))
    b = BinomialDiffusion(binomial_schedule(4))
    with pytest.raises(ValueError, match='NaN'):
        g.q_step(torch.tensor([[float('nan'), 0.]]), steps(1, 1))
    with pytest.raises(ValueError, match='binary'):
        b.q_step(torch.full((2, 3), 0.5), steps(1, 2))
    with pytest.raises(ValueError, match=r'shape \(2,\)'):
        g.q_step(torch.zeros(2, 3), steps(1, 3))
    with pytest.raises(TypeError, match='integer'):
        g.q_step(torch.zeros(2, 3), torch.ones(2))


# --- reverse models returning the wrong thing, mixed devices -----------------------------------

def test_numpy_reverse_is_refused_clearly():
    g = GaussianDiffusion(torch.full((4,), 0.1))
    b = BinomialDiffusion(binomial_schedule(4))
    np_gauss = lambda xt, t: (np.zeros(tuple(xt.shape)), np.ones(tuple(xt.shape)))
    np_binom = lambda xt, t: np.full(tuple(xt.shape), 0.5)
    with pytest.raises(TypeError, match='torch tensors'):
        g.bound(np_gauss, torch.zeros(2, 3))
    with pytest.raises(TypeError, match='torch tensor'):
        b.bound(np_binom, torch.zeros(2, 3))


def test_schedule_and_data_on_different_devices():
    d = GaussianDiffusion(torch.full((4,), 0.1)).to('meta')
    with pytest.raises(ValueError, match='device'):
        d.q_sample(torch.zeros(2, 3), steps(2, 2))
    with pytest.raises(ValueError, match='device'):
        d.bound(lambda xt, t: (xt, torch.ones_like(xt)), torch.zeros(2, 3))
    b = BinomialDiffusion(binomial_schedule(4)).to('meta')
    with pytest.raises(ValueError, match='device'):
        b.entropy_bounds(torch.zeros(2, 3))


def test_reverse_output_on_another_device():
    g = GaussianDiffusion(torch.full((4,), 0.1))
    b = BinomialDiffusion(binomial_schedule(4))
    meta_gauss = lambda xt, t: (torch.zeros_like(xt, device='meta'),
                                torch.ones_like(xt, device='meta'))
    with pytest.raises(ValueError, match='device'):
        g.bound(meta_gauss, torch.zeros(2, 3))
    with pytest.raises(ValueError, match='device'):
        b.bound(lambda xt, t: torch.full_like(xt, 0.5, device='meta'), torch.zeros(2, 3))


# --- code fits the page -------------------------------------------------------------------------

@pytest.mark.parametrize('module', ['diffusion', 'bound', 'entropy'])
def test_exported_core_lines_fit_the_page(module):
    text = (ROOT / 'dpm' / f'{module}.py').read_text()
    generated = re.search(r'^__all__ = \[.*?\]$', text, re.S | re.M)      # nbdev wraps it at 120
    if generated: text = text.replace(generated.group(0), '')
    long = [i + 1 for i, line in enumerate(text.splitlines()) if len(line) > 100]
    assert not long, f'dpm/{module}.py: lines longer than 100 characters: {long}'


# --- value checks without waiting for the device (issue 9: host syncs in the training step) -----

READS = ('__bool__', 'item', 'tolist', '__int__', '__float__', '__index__')


def count_host_reads(fn):
    """How many times `fn` reads a tensor's value back to Python (each one a sync on a GPU)."""
    calls = []
    saved = {n: getattr(torch.Tensor, n) for n in READS}
    def counting(name):
        def read(self, *a, **k):
            calls.append(name)
            return saved[name](self, *a, **k)
        return read
    try:
        for n in READS: setattr(torch.Tensor, n, counting(n))
        fn()
    finally:
        for n, f in saved.items(): setattr(torch.Tensor, n, f)
    return len(calls)


def test_a_deferred_training_step_reads_the_device_once():
    from dpm.diffusion import deferred_checks
    from dpm.image_network import ImageReverse
    from dpm.training import stratified_steps
    torch.manual_seed(0)
    d = GaussianDiffusion(GaussianSchedule(100, learn=False))
    rev = ImageReverse(d, (1, 8, 8), n_scales=2, conv_channels=4, conv_layers=1, hidden_1x1=8,
                       layers_1x1=1, n_bumps=3)
    x0, t = torch.randn(4, 1, 8, 8), stratified_steps(4, 100, torch.device('cpu'))
    def step():
        (-d.bound_estimate(rev, x0, t=t).mean()).backward()
    def deferred_step():
        with deferred_checks() as checks:
            step()
            assert len(checks.pending) >= 4          # recorded, none read yet
    assert count_host_reads(step) >= 4                 # each value check waits for the device
    assert count_host_reads(deferred_step) == 1        # all of them read at once, at the end


def _gauss_model(mean_value=0.0, var_value=1.0):
    return lambda xt, t: (torch.full_like(xt, mean_value), torch.full_like(xt, var_value))


@pytest.mark.parametrize('case, message', [
    ('nan data', 'x0 contains NaN or inf'),
    ('step out of range', 'time steps must lie in 2..10'),
    ('nan output', 'reverse model returned NaN or inf'),
    ('negative variance', 'reverse model returned a non-positive variance'),
])
def test_deferred_checks_raise_what_immediate_checks_raise(case, message):
    from dpm.diffusion import deferred_checks
    d = GaussianDiffusion(torch.full((10,), 0.1))
    x0, t, model = torch.zeros(3, 2), steps(5, 3), _gauss_model()
    if case == 'nan data': x0 = x0.clone(); x0[1, 0] = float('nan')
    if case == 'step out of range': t = torch.tensor([5, 11, 3])
    if case == 'nan output': model = _gauss_model(mean_value=float('nan'))
    if case == 'negative variance': model = _gauss_model(var_value=-1.0)
    with pytest.raises(ValueError, match=re.escape(message)):
        d.bound_estimate(model, x0, t=t)
    def deferred():
        with deferred_checks():
            d.bound_estimate(model, x0, t=t)      # no raise in here: the block's end raises
    with pytest.raises(ValueError, match=re.escape(message)):
        deferred()


def test_deferred_binomial_checks():
    from dpm.diffusion import deferred_checks
    bd = BinomialDiffusion(binomial_schedule(5))
    with pytest.raises(ValueError, match='must be binary'):
        with deferred_checks(): bd.check_data(torch.tensor([[0.0, 0.5]]))
    with pytest.raises(ValueError, match=re.escape('outside [0, 1]')):
        with deferred_checks(): bd.check_reverse(torch.full((1, 2), 1.5), torch.zeros(1, 2))
    with deferred_checks() as checks:                  # clean data: verified and forgotten
        bd.check_data(torch.tensor([[0.0, 1.0]]))
    assert checks.pending == []


def test_sample_checks_its_arguments_as_sample_posterior_does():
    """`d.sample` and `sample_posterior` share one chain and one argument check (02)."""
    d = GaussianDiffusion(torch.full((4,), 0.1))
    with pytest.raises(ValueError, match='floating dtype'):
        d.sample(kernel_reverse(d), (2, 3), dtype=torch.long)
    class Short(torch.nn.Module):
        T = 3
    with pytest.raises(ValueError, match='has 3 steps but the diffusion has 4'):
        d.sample(Short(), (2, 3))


def test_sampling_asks_the_device_nothing_about_t():
    """Every row of a sampling batch is at the same step: no read to find the rows at t = 1."""
    from dpm.diffusion import deferred_checks
    d = GaussianDiffusion(torch.full((20,), 0.1))
    def sample():
        with deferred_checks(): d.sample(_gauss_model(), (4, 2))
    assert count_host_reads(sample) == 1        # the deferred output checks, read once at the end
