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
