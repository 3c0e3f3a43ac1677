"""Posterior sampling (issue 4, dpm.posterior) as a user calls it: every observation kind, both diffusions,
both r-schedules, several batch shapes, every device available; plus the closed-form kernels."""
import math

import pytest
import torch

from dpm.diffusion import BinomialDiffusion, GaussianDiffusion, GaussianSchedule, binomial_schedule
from dpm.posterior import (BitProbabilities, GaussianObservation, LinearGaussianReverse, LogDensity, Mask, denoise,
                           exact_posterior, h_transform_sample, inpaint, r_weights, sample_posterior)

DEVICES = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])


def t_pi(d):
    return lambda xt, t: d.kernel(xt, t)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('shape', [(6, 3), (2, 1, 4, 4)])
@pytest.mark.parametrize('schedule', ['constant', 'annealed'])
def test_gaussian_observations(device, shape, schedule):
    d = GaussianDiffusion(GaussianSchedule(10, learn=False)).to(device)
    y = torch.randn(shape, device=device)
    mask = torch.rand(shape, device=device) < 0.5
    for r in (GaussianObservation(y, 0.1), GaussianObservation(y[0], torch.full(shape[1:], 0.2), mask[0]),
              Mask(y, mask), LogDensity(lambda x: -(x ** 2).flatten(1).sum(1))):
        x = d.sample_posterior(t_pi(d), r, shape, schedule=schedule, device=device)
        assert x.shape == shape and x.device.type == device and torch.isfinite(x).all()
    x = inpaint(d, t_pi(d), y, mask, schedule=schedule)
    assert torch.equal(x[mask], y[mask])
    assert denoise(d, t_pi(d), y, 0.3, schedule=schedule).shape == shape


@pytest.mark.parametrize('device', DEVICES)
def test_binomial_observations(device):
    d = BinomialDiffusion(binomial_schedule(20), p=0.2).to(device)
    y = (torch.rand(5, 8, device=device) < 0.5).float()
    mask = torch.rand(5, 8, device=device) < 0.5
    x = sample_posterior(d, t_pi(d), Mask(y, mask), (5, 8), device=device)
    assert torch.equal(x[mask], y[mask]) and ((x == 0) | (x == 1)).all()
    hard = torch.tensor([1.0, 0.0] * 4, device=device)
    x = sample_posterior(d, t_pi(d), BitProbabilities(hard), (50, 8), device=device)
    assert (x == hard).all()                           # d_i in {0, 1} clamps the bit


def test_binomial_kernel_is_the_normalised_product():
    c, p1 = torch.rand(1000), torch.rand(1000)
    out = BitProbabilities(p1).perturb(BinomialDiffusion(binomial_schedule(5)), c, 1.0)
    assert torch.allclose(out, c * p1 / (c * p1 + (1 - c) * (1 - p1)))
    half = BitProbabilities(torch.full((1000,), 0.5)).perturb(BinomialDiffusion(binomial_schedule(5)), c, 1.0)
    assert torch.allclose(half, c)                     # r = 1/2 carries no information


def test_gaussian_product_and_mean_shift():
    d = GaussianDiffusion(GaussianSchedule(5, learn=False))
    mu, var = torch.randn(4, 3), torch.rand(4, 3) + 0.1
    y, s2 = torch.randn(4, 3), 0.5
    m, v = GaussianObservation(y, s2).perturb(d, (mu, var), 1.0)
    assert torch.allclose(v, 1 / (1 / var + 1 / s2)) and torch.allclose(m, v * (mu / var + y / s2))
    m2, v2 = LogDensity(lambda x: -0.5 * ((x - y) ** 2 / s2).sum(1)).perturb(d, (mu, var), 1.0)
    assert torch.allclose(m2, mu + var * (y - mu) / s2) and torch.equal(v2, var)


def test_r_weights():
    assert torch.equal(r_weights('constant', 4), torch.ones(5, dtype=torch.float64))
    assert torch.allclose(r_weights('annealed', 4), torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0], dtype=torch.float64))


def test_h_transform_matches_exact_posterior():
    d = GaussianDiffusion(GaussianSchedule(20, learn=False))
    model = LinearGaussianReverse.for_gaussian_data(d, torch.tensor([[1.0, 0.9], [0.9, 1.0]]))
    r = GaussianObservation(torch.tensor([1.0, 0.0]), 0.05, torch.tensor([True, False]))
    mean, cov = exact_posterior(d, model, r)
    n = 20000
    x = h_transform_sample(d, model, r, n, generator=torch.Generator().manual_seed(0))
    se = (torch.diagonal(cov) / n).sqrt()
    assert ((x.mean(0) - mean).abs() < 5 * se).all()
    assert ((x.var(0) - torch.diagonal(cov)).abs() < 5 * math.sqrt(2 / n) * torch.diagonal(cov)).all()


@pytest.mark.parametrize('make, message', [
    (lambda: Mask(torch.zeros(3), torch.ones(2, dtype=torch.bool)), 'mask has shape'),
    (lambda: GaussianObservation(torch.zeros(3), 0.0), 'positive'),
    (lambda: GaussianObservation(torch.tensor([float('nan'), 0.0]), 1.0), 'NaN'),
    (lambda: BitProbabilities(torch.tensor([0.5, 1.5])), '[0, 1]'),
])
def test_bad_observations(make, message):
    with pytest.raises(ValueError, match=message.replace('[', r'\[').replace(']', r'\]')):
        make()


def test_bad_combinations():
    gd = GaussianDiffusion(GaussianSchedule(5, learn=False))
    bd = BinomialDiffusion(binomial_schedule(5))
    with pytest.raises(ValueError, match='observation has shape'):
        sample_posterior(gd, t_pi(gd), GaussianObservation(torch.zeros(4), 0.1), (2, 3))
    with pytest.raises(TypeError, match='GaussianDiffusion'):
        sample_posterior(bd, t_pi(bd), GaussianObservation(torch.zeros(3), 0.1), (2, 3))
    with pytest.raises(TypeError, match='BinomialDiffusion'):
        sample_posterior(gd, t_pi(gd), BitProbabilities(torch.full((3,), 0.5)), (2, 3))
    with pytest.raises(ValueError, match='schedule'):
        sample_posterior(gd, t_pi(gd), Mask(torch.zeros(3), torch.ones(3, dtype=torch.bool)), (2, 3), schedule='x')


def test_binomial_log_density_linear_is_factorised():
    d = BinomialDiffusion(binomial_schedule(5))
    c, p1 = torch.rand(50, 6, dtype=torch.float64), torch.rand(50, 6, dtype=torch.float64)
    lin = LogDensity(lambda x: (x * torch.logit(p1)).sum(1))
    assert torch.allclose(lin.perturb(d, c, 1.0), BitProbabilities(p1).perturb(d, c, 1.0))
    x = sample_posterior(d, t_pi(d), lin, (50, 6), dtype=torch.float64)
    assert ((x == 0) | (x == 1)).all()


@pytest.mark.parametrize('int_dtype', [torch.long, torch.int32, torch.uint8])
def test_inpaint_and_denoise_accept_integer_observations(int_dtype):
    """Integer pixels/bits (issue 11): float samples, or a clear error, never NotImplementedError "normal_kernel_cpu"."""
    gd = GaussianDiffusion(GaussianSchedule(5, learn=False))
    y = torch.tensor([[1, 2, 3], [0, 1, 0]], dtype=int_dtype)
    mask = torch.tensor([[True, False, True], [False, False, True]])
    x = inpaint(gd, t_pi(gd), y, mask)
    assert x.is_floating_point() and x.shape == y.shape and torch.equal(x[mask], y[mask].to(x.dtype))
    assert denoise(gd, t_pi(gd), y, 0.1).is_floating_point()
    bd = BinomialDiffusion(binomial_schedule(5), p=0.2)
    bits = torch.tensor([[1, 0, 1, 1]], dtype=int_dtype)
    xb = inpaint(bd, t_pi(bd), bits, torch.tensor([[True, True, False, False]]))
    assert xb.is_floating_point() and torch.equal(xb[0, :2], torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match='floating'):
        sample_posterior(gd, t_pi(gd), Mask(y[0], mask[0]), (2, 3), dtype=torch.long)


def test_linear_gaussian_reverse_refuses_a_diffusion_of_another_length():
    """A model built for T steps used with a diffusion of another length is refused (issue 11), not truncated."""
    Sigma = torch.tensor([[1.0, 0.5], [0.5, 1.0]])
    model = LinearGaussianReverse.for_gaussian_data(GaussianDiffusion(GaussianSchedule(20, learn=False)), Sigma)
    short = GaussianDiffusion(GaussianSchedule(10, learn=False))
    r = GaussianObservation(torch.tensor([1.0, 0.0]), 0.1, torch.tensor([True, False]))
    for call in (lambda: model.steps(short), lambda: model.marginal_covariances(short),
                 lambda: exact_posterior(short, model, r), lambda: h_transform_sample(short, model, r, 5),
                 lambda: sample_posterior(short, model, r, (4, 2))):
        with pytest.raises(ValueError, match='20 steps.*10'):
            call()
    long = GaussianDiffusion(GaussianSchedule(30, learn=False))
    with pytest.raises(ValueError, match='20 steps.*30'):
        sample_posterior(long, model, r, (4, 2))


def test_interactive_posterior_frames():
    """The frame functions of chapter 09's widgets/animations: they draw, follow the observation, refuse
    bad input."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from dpm.posterior import draw_2d_posterior, draw_bit_posterior, parse_bits
    y, mask = parse_bits('01??')
    assert y.tolist() == [0.0, 1.0, 0.0, 0.0] and mask.tolist() == [True, True, False, False]
    for bad in ('', '01x', None, 5):
        with pytest.raises(ValueError, match="'0', '1' and '\\?'"): parse_bits(bad)
    bd = BinomialDiffusion(binomial_schedule(10), p=0.2)
    gd = GaussianDiffusion(GaussianSchedule(10, learn=False))
    fig, ax = plt.subplots()
    try:
        a = draw_bit_posterior(ax, bd, t_pi(bd), '1?0?', 6)
        b = draw_bit_posterior(ax, bd, t_pi(bd), '0?1?', 6)
        assert len(ax.images) == 1 and (a[:, 0] == 1).all() and (b[:, 0] == 0).all() and (a[:, 2] == 0).all()
        with pytest.raises(TypeError, match='BinomialDiffusion'): draw_bit_posterior(ax, gd, t_pi(gd), '01')
        obs = lambda v: GaussianObservation(torch.tensor([v, 0.0]), 0.01, torch.tensor([True, False]))
        xa, xb = draw_2d_posterior(ax, gd, t_pi(gd), obs(-1.0), 100), draw_2d_posterior(ax, gd, t_pi(gd), obs(1.0), 100)
        assert xa.shape == (100, 2) and xa[:, 0].mean() < 0 < xb[:, 0].mean() and len(ax.collections) == 1
        with pytest.raises(TypeError, match='GaussianDiffusion'):
            draw_2d_posterior(ax, bd, t_pi(bd), Mask(torch.zeros(2), torch.ones(2, dtype=torch.bool)))
    finally:
        plt.close(fig)
