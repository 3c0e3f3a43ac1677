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


# --- the noised recipe (eq-post-noised-r, eq-post-replacement) and Gaussian data of any mean ---

SIGMA3 = torch.tensor([[1.0, 0.8, 0.3], [0.8, 1.0, 0.6], [0.3, 0.6, 1.0]], dtype=torch.float64)


def _toy(T=40):
    d = GaussianDiffusion(GaussianSchedule(T, learn=False))
    return d, LinearGaussianReverse.for_gaussian_data(d, SIGMA3)


def test_default_recipe_is_the_paper_chain_unchanged():
    """The default of every call is the paper's constant recipe, bit for bit the chain `r.perturb` at every step."""
    from dpm.bound import _ancestral
    from dpm.posterior import r_weights
    d, model = _toy(10)
    y = torch.randn(64, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    mask = torch.rand(64, 3, generator=torch.Generator().manual_seed(1)) < 0.5
    for r, call in ((GaussianObservation(y, 0.2), lambda g, **k: denoise(d, model, y, 0.2, generator=g, **k)),
                    (Mask(y, mask), lambda g, **k: inpaint(d, model, y, mask, generator=g, **k))):
        w = r_weights('constant', d.T).tolist()
        old = _ancestral(d, model, torch.zeros_like(y), torch.Generator().manual_seed(2), False,
                         lambda params, t: r.perturb(d, params, w[t]))
        assert torch.equal(call(torch.Generator().manual_seed(2)), old)
        assert torch.equal(call(torch.Generator().manual_seed(2), recipe='paper'), old)
    with pytest.raises(ValueError, match="'paper' or 'noised'"):
        denoise(d, model, y, 0.2, recipe='exact')


def test_noised_recipe_targets_the_posterior_better():
    """Denoising the 3-D toy (sigma^2 = 0.1): one sample's squared error per row for the paper's recipe, the
    noised recipe and an exact posterior sample of the same y. Paired one-sided z-test at 5 standard errors
    (false pass below 3e-7): the noised recipe's gap to the exact samples' error is smaller than the paper's.
    The closed form (chapter 09) expects about 13 standard errors at this n."""
    d, model = _toy()
    n, s2 = 20000, 0.1
    P0 = model.marginal_covariances(d)[0]
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(n, 3, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(P0).T
    y = x0 + s2 ** 0.5 * torch.randn(n, 3, generator=g, dtype=torch.float64)
    K = P0 @ torch.linalg.inv(P0 + s2 * torch.eye(3, dtype=torch.float64))
    C = P0 - K @ P0
    exact = y @ K.T + torch.randn(n, 3, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(C).T
    err = {name: ((x - x0) ** 2).mean(1) for name, x in (
        ('paper', denoise(d, model, y, s2, generator=g)),
        ('noised', denoise(d, model, y, s2, generator=g, recipe='noised')), ('exact', exact))}
    gap_paper, gap_noised = err['paper'] - err['exact'], err['noised'] - err['exact']
    assert gap_paper.mean() < 0 and gap_noised.mean() < 0          # both too concentrated (closed form)
    closer = gap_noised - gap_paper                                 # |gap paper| - |gap noised| per row
    assert closer.mean() / (closer.std() / math.sqrt(n)) > 5
    assert abs(gap_noised.mean()) < 0.5 * abs(gap_paper.mean())


@pytest.mark.parametrize('device', DEVICES)
def test_noised_inpainting_is_y_at_t0_and_noised_before(device):
    """Replacement: the known entries are y exactly at t = 0 (both diffusions), and forward-noised before."""
    d = GaussianDiffusion(GaussianSchedule(20, learn=False)).to(device)
    y = torch.randn(50, 4, device=device)
    mask = torch.rand(50, 4, device=device) < 0.5
    x = inpaint(d, t_pi(d), y, mask, recipe='noised')
    assert torch.equal(x[mask], y[mask])
    from dpm.posterior import NoisedMask
    traj = sample_posterior(d, t_pi(d), NoisedMask(y, mask), (50, 4), return_trajectory=True)
    mid = traj[:, d.T // 2]
    assert torch.equal(traj[:, 0][mask], y[mask]) and not torch.equal(mid[mask], y[mask])
    bd = BinomialDiffusion(binomial_schedule(20), p=0.2).to(device)
    bits = (torch.rand(50, 8, device=device) < 0.5).float()
    keep = torch.rand(50, 8, device=device) < 0.5
    xb = inpaint(bd, t_pi(bd), bits, keep, recipe='noised')
    assert torch.equal(xb[keep], bits[keep]) and ((xb == 0) | (xb == 1)).all()


def test_noised_kernel_is_the_normalised_product_at_every_step():
    """N(mu, var) times N(sqrt(abar_s) y; x, abar_s s2 + 1 - abar_s), normalised by quadrature, for s = 0..T."""
    from dpm.posterior import NoisedGaussianObservation
    d = GaussianDiffusion(GaussianSchedule(30, learn=False))
    alpha_bar = d.alphas_bar().double()
    g = torch.Generator().manual_seed(4)
    mu, var = torch.randn(d.T + 1, generator=g, dtype=torch.float64), 0.05 + torch.rand(d.T + 1, generator=g, dtype=torch.float64)
    y, s2 = -0.4, 0.3
    r = NoisedGaussianObservation(torch.tensor([y], dtype=torch.float64), s2)
    grid = torch.linspace(-10, 10, 20001, dtype=torch.float64)
    for s in range(d.T + 1):
        v_s = alpha_bar[s] * s2 + 1 - alpha_bar[s]
        log_p = -0.5 * (grid - mu[s]) ** 2 / var[s] - 0.5 * (alpha_bar[s].sqrt() * y - grid) ** 2 / v_s
        p = (log_p - log_p.max()).exp(); p /= p.sum()
        m_direct = (grid * p).sum(); v_direct = ((grid - m_direct) ** 2 * p).sum()
        m, v = r.perturb_step(d, (mu[s].view(1, 1), var[s].view(1, 1)), 1.0, s)
        assert abs(m.item() - m_direct.item()) < 1e-6 * v_direct and abs(v.item() / v_direct - 1) < 1e-6, s
    with pytest.raises(TypeError, match='GaussianDiffusion'):
        sample_posterior(BinomialDiffusion(binomial_schedule(5)), None, r, (2, 1))


def test_linear_model_with_a_mean_and_its_exact_posterior():
    """Data N(m, Sigma): the offsets b_t (eq-post-linear-mean) move the model's marginal to m, and the
    h-transform still samples the exact posterior (5 standard errors per coordinate)."""
    d = GaussianDiffusion(GaussianSchedule(20, learn=False))
    m = torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)
    model = LinearGaussianReverse.for_gaussian_data(d, SIGMA3, m)
    m0, P0 = (x[0] for x in model.marginal_moments(d))
    # the start pi (mean 0, not sqrt(abar_T) m) and the T_pi step leave a small offset; without b_t it is m
    assert (m0 - m).abs().max() < d.alphas_bar()[-1].sqrt() * m.abs().max()
    x = d.sample(model, (20000, 3), dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    assert ((x.mean(0) - m0).abs() < 5 * (torch.diagonal(P0) / 20000).sqrt()).all()
    r = GaussianObservation(torch.tensor([2.5, 0.0, 0.0]), 0.05, torch.tensor([True, False, False]))
    mean, cov = exact_posterior(d, model, r)
    h = h_transform_sample(d, model, r, 20000, generator=torch.Generator().manual_seed(6))
    assert ((h.mean(0) - mean).abs() < 5 * (torch.diagonal(cov) / 20000).sqrt()).all()
    with pytest.raises(ValueError, match='the mean has 2'):
        LinearGaussianReverse.for_gaussian_data(d, SIGMA3, torch.zeros(2))


def test_gaussian_data_reverse_matches_the_direct_model_and_scales():
    """The eigenbasis (eq-post-eigen) against the direct matrices for D = 3; then D = 784, T = 1000 in
    O(D^2 + T D) memory, image-shaped batches, both recipes."""
    from dpm.posterior import GaussianDataReverse
    d = GaussianDiffusion(GaussianSchedule(25, learn=False))
    m = torch.tensor([0.3, 0.0, -2.0], dtype=torch.float64)
    direct, eigen = LinearGaussianReverse.for_gaussian_data(d, SIGMA3, m), GaussianDataReverse(d, m, SIGMA3)
    x, t = torch.randn(25, 3, dtype=torch.float64), torch.arange(1, 26)
    for a, b in zip(direct(x, t), eigen(x, t)): assert torch.allclose(a, b, atol=1e-12)
    for name in ('A', 'b', 'v'): assert torch.allclose(getattr(direct, name)[1:], getattr(eigen.dense(), name)[1:], atol=1e-12)
    big = GaussianDiffusion(GaussianSchedule(1000, learn=False))
    side = torch.arange(28, dtype=torch.float64)
    dist = ((side[:, None, None, None] - side[None, None, :, None]) ** 2
            + (side[None, :, None, None] - side[None, None, None, :]) ** 2).sqrt().reshape(784, 784)
    model = GaussianDataReverse(big, torch.full((1, 28, 28), 0.1), 0.8 ** dist)     # a smooth image model
    assert sum(b.numel() for b in model.buffers()) < 784 * 784 + 3 * 1001 * 784
    y = torch.randn(2, 1, 28, 28)
    for recipe in ('paper', 'noised'):
        out = denoise(big, model, y, 1.0, recipe=recipe, generator=torch.Generator().manual_seed(7))
        assert out.shape == y.shape and torch.isfinite(out).all()
    with pytest.raises(ValueError, match='semi-definite'):
        GaussianDataReverse(d, m, -SIGMA3)


@pytest.mark.parametrize('device', DEVICES)
def test_both_recipes_run_where_the_diffusion_is(device):
    """GaussianDataReverse follows the diffusion's device; both recipes of denoise and inpaint run there."""
    from dpm.posterior import GaussianDataReverse
    d = GaussianDiffusion(GaussianSchedule(50, learn=False)).to(device)
    model = GaussianDataReverse(d, torch.zeros(16), 0.5 * torch.eye(16) + 0.5)
    assert model.lin_eigvecs.device.type == device
    y = torch.randn(8, 1, 4, 4, device=device)
    mask = torch.rand(8, 1, 4, 4, device=device) < 0.5
    for recipe in ('paper', 'noised'):
        x = denoise(d, model, y, 0.5, recipe=recipe)
        assert x.device.type == device and x.shape == y.shape and torch.isfinite(x).all()
        x = inpaint(d, model, y, mask, recipe=recipe)
        assert torch.equal(x[mask], y[mask])


def test_mean_shift_with_a_basis_is_the_full_covariance_step():
    "eq-post-mean-shift for N(mu, U diag(v) U^T): mu + w C grad log r(mu), C dense; variance kept."
    g = torch.Generator().manual_seed(5)
    U = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=torch.float64))[0]
    mu, y = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    v = torch.rand(3, 4, generator=g, dtype=torch.float64) + 0.1
    d = GaussianDiffusion(torch.full((5,), 0.1, dtype=torch.float64))
    m2, v2, U2 = LogDensity(lambda x: -0.5 * ((x - y) ** 2).sum(1)).perturb(d, (mu, v, U), 0.7)
    C = U @ torch.diag_embed(v) @ U.T                           # (3, 4, 4): one per row
    expect = mu + 0.7 * (C @ (y - mu)[..., None])[..., 0]
    assert torch.allclose(m2, expect, atol=1e-12) and torch.equal(v2, v) and U2 is U
