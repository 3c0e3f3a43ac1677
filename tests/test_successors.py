"""The successors' kernels and losses (dpm.successors): the eps mean against the forward posterior,
L_simple's weights recovered from the bound's KL terms, the interpolated variance's bounds, the
cosine schedule's endpoints, the verdict, and clear errors on bad input."""
import math

import pytest
import torch

from dpm.diffusion import GaussianDiffusion, GaussianSchedule
from dpm.reverse import MLPReverse
from dpm.successors import (LADDER, SuccessorReverse, compare_variants, cosine_schedule, eps_mean,
                            interpolated_variance, ladder_models, posterior_variance,
                            posterior_variances, simple_weights, successor_loss, train_successor,
                            verdict)


def _d(T=20):
    return GaussianDiffusion(GaussianSchedule(T, beta_1=1e-3, learn=False))


def _model(d, mean='eps', variance='beta_tilde', seed=0):
    torch.manual_seed(seed)
    return SuccessorReverse(MLPReverse(d, 2, 16, 1, readout='bumps'), mean, variance)


def test_eps_mean_is_the_posterior_mean_at_the_true_noise():
    d, x0, eps = _d(), torch.randn(64, 2, dtype=torch.float64), torch.randn(64, 2, dtype=torch.float64)
    t = torch.randint(2, d.T + 1, (64,))
    xt = d.draw(d.marginal(x0, t), eps)
    mean, var = d.posterior(x0, xt, t)
    torch.testing.assert_close(eps_mean(d, xt, eps, t), mean)
    torch.testing.assert_close(posterior_variance(d, t, xt), var)


@pytest.mark.parametrize('variance', ['beta', 'beta_tilde'])
def test_simple_weights_are_the_kl_terms_weights(variance):
    "KL(t) - KL(t at the true noise) = w_t ||eps - eps_theta||^2, for every t = 2..T."
    d, B = _d(), 32
    w = simple_weights(d, variance)
    assert w.shape == (d.T - 1,) and (w > 0).all()
    x0, eps, err = (torch.randn(B, 2, dtype=torch.float64) for _ in range(3))
    for t in range(2, d.T + 1):
        ts = torch.full((B,), t)
        xt = d.draw(d.marginal(x0, ts), eps)
        sigma2 = d.betas[ts - 1][:, None].expand_as(xt) if variance == 'beta' else \
            posterior_variance(d, ts, xt)
        q = d.posterior(x0, xt, ts)
        kl = lambda e: d.kl(q, (eps_mean(d, xt, e, ts), sigma2))
        ratio = (kl(eps + err) - kl(eps)) / (err ** 2).sum(1)
        torch.testing.assert_close(ratio, torch.full_like(ratio, w[t - 2].item()))


def test_interpolated_variance_lies_between_beta_tilde_and_beta():
    d, z = _d(), 10 * torch.randn(200, 2, dtype=torch.float64)
    t = torch.randint(2, d.T + 1, (200,))
    v = interpolated_variance(d, z, t)
    lo, hi = posterior_variance(d, t, z), d.betas[t - 1][:, None].expand_as(z)
    assert (v >= lo * (1 - 1e-12)).all() and (v <= hi * (1 + 1e-12)).all()
    assert (posterior_variances(d)[1:] < d.betas[1:]).all()        # beta~_t < beta_t for t >= 2


def test_cosine_schedule_endpoints():
    for T in (10, 100, 1000):
        b = cosine_schedule(T)
        alpha_bar = torch.cumprod(1 - b, 0)
        assert b.shape == (T,) and (b > 0).all() and b.max() <= 0.999 + 1e-12
        assert alpha_bar[-1] < 1e-3 and abs(alpha_bar[0] - 1) < 0.03     # from ~1 down to ~0
        assert (b[1:] >= b[:-1] - 1e-12).all()                              # increasing
    assert cosine_schedule(50, beta_1=1e-4)[0].item() == 1e-4


def test_losses_run_and_train_the_right_parts():
    d = _d()
    x0, t, noise = torch.randn(16, 2), torch.randint(2, d.T + 1, (16,)), torch.randn(16, 2)
    for name, (mean, variance, loss, _) in LADDER.items():
        m = _model(d, mean, variance)
        value = successor_loss(d, m, x0, t, noise, loss)
        assert value.shape == (16,) and torch.isfinite(value).all()
    m = _model(d, 'eps', 'interp')
    torch.testing.assert_close(successor_loss(d, m, x0, t, noise, 'simple'),
                               ((noise - m.eps(d.draw(d.marginal(x0, t), noise), t)) ** 2).mean(1))


def test_bad_input_is_refused():
    d = _d()
    with pytest.raises(ValueError, match='variance'): _model(d, 'eps', 'fixed')
    with pytest.raises(ValueError, match='mean'): _model(d, 'x0')
    with pytest.raises(ValueError, match="needs mean='eps'"): _model(d, 'paper', 'beta')
    with pytest.raises(ValueError, match='loss'):
        successor_loss(d, _model(d), torch.randn(4, 2), torch.full((4,), 2), torch.randn(4, 2), 'l1')
    with pytest.raises(ValueError, match='interp'):
        successor_loss(d, _model(d), torch.randn(4, 2), torch.full((4,), 2), torch.randn(4, 2), 'hybrid')
    with pytest.raises(ValueError, match='noise prediction'):
        successor_loss(d, _model(d, 'reference', 'learned'), torch.randn(4, 2), torch.full((4,), 2),
                       torch.randn(4, 2), 'simple')
    with pytest.raises(ValueError, match='T must'): cosine_schedule(1)
    with pytest.raises(ValueError, match='beta'): simple_weights(d, 'learned')
    with pytest.raises(ValueError, match='se'): verdict(1.0, float('nan'))
    with pytest.raises(TypeError): SuccessorReverse(torch.nn.Linear(2, 2))


def test_verdict():
    assert verdict(1.0, 0.1) == 'held' and verdict(-1.0, 0.1) == 'did not hold'
    assert verdict(0.2, 0.1) == 'undecided'


def test_a_tiny_ladder_trains_and_pairs():
    d = _d(8)
    models = ladder_models(lambda d_: MLPReverse(d_, 2, 16, 1, readout='bumps'), d)
    assert models['iddpm_cosine'].diffusion.betas[0].item() == d.betas[0].item()
    same = [p.detach().clone() for p in models['paper'].trunk.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(same, models['ddpm'].trunk.parameters()))
    x = torch.randn(200, 2)
    r = train_successor(models['ddpm'], 'simple', x, 3, 16)
    assert r['steps'] == 3 and r['seconds_per_step'] > 0
    out = compare_variants({'reference': models['reference'], 'ddpm': models['ddpm']}, x[:50])
    assert out['reference']['minus_reference_bits'] == 0.0
    assert math.isfinite(out['ddpm']['minus_reference_se']) and len(out['ddpm']['kl_t_bits']) == 7
