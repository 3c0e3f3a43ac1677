"The image network's contract (chapter 10): shapes, errors, formats, variants."
import math
import pytest
import torch
from dpm.diffusion import GaussianDiffusion, GaussianSchedule, BinomialDiffusion, binomial_schedule
from dpm.image_network import ImageReverse, MultiScaleConv, IMAGE_CONFIGS, count_parameters

T = 12
TINY = dict(n_scales=3, conv_channels=4, conv_layers=2, dense_hidden=16, hidden_1x1=6, n_bumps=3)


@pytest.fixture(scope='module')
def d():
    return GaussianDiffusion(GaussianSchedule(T))


@pytest.mark.parametrize('pathway', ['conv', 'dense', 'both'])
@pytest.mark.parametrize('variant', ['paper', 'reference'])
def test_shapes_and_kernel(d, pathway, variant):
    torch.manual_seed(0)
    model = ImageReverse(d, (2, 8, 12), pathway=pathway, variant=variant, **TINY)
    x, t = torch.randn(5, 2, 8, 12), torch.tensor([2, 3, 7, 11, 12])
    mean, var = d.check_reverse(model(x, t), x)
    assert mean.dtype == var.dtype == torch.float32 and ((var > 0) & (var < 1)).all()
    assert model.raw(x, t).shape == (5, 2, 2, 8, 12)
    single = torch.cat([model(x[i:i + 1], t[i:i + 1])[0] for i in range(5)])
    assert torch.allclose(mean, single, atol=1e-5)


def test_errors(d):
    with pytest.raises(ValueError, match='divisible'): ImageReverse(d, (1, 12, 12), n_scales=4)
    model = ImageReverse(d, (3, 8, 8), **TINY)
    with pytest.raises(ValueError, match='channel mismatch'): model(torch.randn(2, 1, 8, 8), torch.full((2,), 3))
    with pytest.raises(ValueError, match='expected images'): model(torch.randn(2, 3, 8), torch.full((2,), 3))
    with pytest.raises(ValueError, match='time steps'): model(torch.randn(2, 3, 8, 8), torch.full((2,), T + 1))
    with pytest.raises(ValueError, match='Gaussian'):
        ImageReverse(BinomialDiffusion(binomial_schedule(5)), (1, 8, 8), **TINY)
    with pytest.raises(ValueError, match='divisible'): MultiScaleConv(1, 2, n_scales=2)(torch.randn(1, 1, 5, 4))


def test_channels_last_and_bf16(d):
    torch.manual_seed(0)
    model = ImageReverse(d, (3, 8, 8), pathway='both', **TINY)
    x, t = torch.randn(4, 3, 8, 8), torch.tensor([2, 5, 9, 12])
    mean, var = model(x, t)
    cl = model.to(memory_format=torch.channels_last)
    mean_cl, var_cl = cl(x.contiguous(memory_format=torch.channels_last), t)
    assert torch.allclose(mean_cl, mean, atol=1e-5) and torch.allclose(var_cl, var, rtol=1e-4)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        mean_bf, var_bf = model(x, t)
    assert mean_bf.dtype == var_bf.dtype == torch.float32
    assert (mean_bf - mean).abs().max() < 0.02


def test_reference_kernel_at_zero(d):
    model = ImageReverse(d, (1, 8, 8), variant='reference', **TINY)
    with torch.no_grad(): model.readout.weight.zero_(); model.readout.bias.zero_()
    x, t = torch.randn(3, 1, 8, 8), torch.tensor([2, 6, 12])
    beta = d.betas[t - 1].float().view(-1, 1, 1, 1)
    mean, var = model(x, t)
    assert torch.allclose(mean, x * (1 - beta).sqrt(), atol=1e-6)
    assert torch.allclose(var, beta.expand_as(x), rtol=1e-5)


def test_parameter_counts():
    d = GaussianDiffusion(GaussianSchedule(1000, learn=False))
    n = {k: count_parameters(ImageReverse(d, **cfg)) for k, cfg in IMAGE_CONFIGS.items()}
    assert 1.3e6 < n['dead_leaves'] < 1.5e6                      # the anchor: about 1.4 M
    dense = count_parameters(ImageReverse(d, **IMAGE_CONFIGS['cifar10']).dense)
    assert dense == 3072 * 1000 + 1000 + 1000 * 5 * 1024 + 5 * 1024      # about 8.2 M
    assert n['cifar10'] > dense and math.isfinite(n['mnist'])


def _eigen_pair(d, seed=0):
    "A residual network on the whole Gaussian kernel (eq-net-residual-eig) and its linear path."
    from dpm.baselines import LinearReverse, fit_eigen
    torch.manual_seed(seed)
    x = (torch.randn(300, 16) @ (torch.randn(16, 16) / 4) + 0.1).reshape(300, 1, 4, 4)
    lin = LinearReverse(d, (1, 4, 4), fit_eigen(x), covariance='eigen')
    net = ImageReverse(d, (1, 4, 4), pathway='both', variant='reference', linear=lin,
                       n_scales=2, conv_channels=3, conv_layers=1, dense_hidden=8, hidden_1x1=4,
                       n_bumps=3)
    return x, lin, net


def test_eigen_kernel_bound_training_and_sampling(d):
    "(mean, var, U) passes check_reverse, trains, samples and denoises; K equals the linear model's."
    from dpm.baselines import paired_bounds
    from dpm.posterior import denoise
    x, lin, net = _eigen_pair(d)
    mean, var, U = d.check_reverse(net(x[:5], torch.full((5,), 4)), x[:5])
    assert torch.allclose(U @ U.T, torch.eye(16), atol=1e-5)
    r = paired_bounds(d, dict(net=net, lin=lin), x[:32])
    assert torch.allclose(r['net']['k'], r['lin']['k'])
    loss = -d.bound_estimate(net, x[:16]).mean()
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)
    s = d.sample(net, (6, 1, 4, 4))
    assert s.shape == (6, 1, 4, 4) and torch.isfinite(s).all()
    for recipe in ('paper', 'noised'):
        y = denoise(d, net, x[:3] + torch.randn(3, 1, 4, 4), 1.0, recipe=recipe)
        assert y.shape == (3, 1, 4, 4) and torch.isfinite(y).all()


def test_eigen_kernel_refusals(d):
    "A wrong basis and value-by-value observations on a basis kernel each get one clear error."
    from dpm.posterior import inpaint
    from dpm.baselines import LinearReverse
    x, lin, net = _eigen_pair(d, 1)
    m, v, U = lin(x[:2], torch.tensor([3, 3]))
    with pytest.raises(ValueError, match=r'\(16, 16\) tensor'):
        d.check_reverse((m, v, U[:, :8]), x[:2])
    with pytest.raises(ValueError, match='basis'):
        mask = torch.zeros(2, 1, 4, 4, dtype=torch.bool)
        mask[..., 0] = True
        inpaint(d, net, x[:2], mask)
    with pytest.raises(ValueError, match="'diagonal', 'eigen'"):
        LinearReverse(d, (1, 4, 4), lin.fit, covariance='full')


def test_cat_kernels_shares_a_basis(d):
    "Row blocks of kernel parameters join along the rows; a basis is kept once, not stacked."
    from dpm.bound import cat_kernels
    x, lin, _ = _eigen_pair(d, 2)
    parts = [lin(x[:3], torch.full((3,), 4)), lin(x[3:5], torch.full((2,), 7))]
    m, v, U = cat_kernels(parts)
    assert m.shape == (5, 1, 4, 4) and v.shape == (5, 1, 4, 4) and U is parts[0][2]
    assert torch.equal(cat_kernels([x[:2], x[2:4]]), x[:4])
