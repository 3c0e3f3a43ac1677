"""Dead leaves: generator, closed forms, Gaussian baseline, experiment configuration and bad input (fast)."""
import math
import pytest
import torch
from dpm.dead_leaves import (dead_leaves_levels, dequantize, window_radii, window_radii_cdf, lens_area,
                             same_disk_probability, fit_scale, ceiling_bits, gaussian_log_likelihood,
                             DEAD_LEAVES, DEAD_LEAVES_GPU, L_NULL_BITS, _build, _data, _evaluate)
from dpm.image_network import IMAGE_CONFIGS


def test_generator_seeded_and_covering():
    a = dead_leaves_levels(20, 16, generator=torch.Generator().manual_seed(0))
    b = dead_leaves_levels(20, 16, generator=torch.Generator().manual_seed(0))
    assert a.shape == (20, 16, 16) and a.dtype == torch.int16 and torch.equal(a, b)
    assert a.min() >= 0 and a.max() <= 255
    c = dead_leaves_levels(20, 16, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(a, c)
    # the broadcasting (GPU) path gives the same images from the same random numbers
    m = dead_leaves_levels(20, 16, generator=torch.Generator().manual_seed(0), matmul=False)
    assert (m != a).float().mean() < 1e-3


def test_generator_bad_input():
    for kw in (dict(r_min=0.0), dict(r_min=5.0, r_max=4.0), dict(levels=1), dict(size=0)):
        with pytest.raises(ValueError): dead_leaves_levels(2, **{'size': 8, **kw})


def test_dequantize_is_uniform():
    k = torch.randint(256, (200, 32, 32), generator=torch.Generator().manual_seed(0), dtype=torch.int16)
    x = dequantize(k, generator=torch.Generator().manual_seed(1))
    assert x.min() >= 0 and x.max() <= 1
    assert ((x * 256).floor().to(torch.int16) == k).float().mean() > 0.999   # float32 rounding at k + 1
    m, s = fit_scale(x)
    assert abs(m - 0.5) < 0.01 and abs(s ** 2 - 1 / 12) < 0.002
    assert abs(ceiling_bits(1 / math.sqrt(12)) - (8 - 0.5 * math.log2(12))) < 1e-12
    assert abs(L_NULL_BITS + 2.047) < 1e-3


def test_radii_and_closed_forms():
    r = window_radii(50_000, 64, generator=torch.Generator().manual_seed(0)).double().sort().values
    F = window_radii_cdf(r, 64)
    n = len(r)
    ks = torch.maximum(torch.arange(1, n + 1) / n - F, F - torch.arange(n) / n).max().item()
    assert ks < 1.95 / math.sqrt(n)
    r0 = torch.tensor(2.0, dtype=torch.float64)
    assert torch.isclose(lens_area(r0, torch.tensor(0.0, dtype=torch.float64)), 4 * math.pi * torch.ones((), dtype=torch.float64))
    p = same_disk_probability([0.0, 1.0, 4.0, 16.0, 200.0])
    assert p[0] == pytest.approx(1.0) and (p.diff() < 0).all() and p[-1] == 0


def test_same_disk_probability_matches_generator():
    k = dead_leaves_levels(600, 32, generator=torch.Generator().manual_seed(3))
    for d in (1, 4):
        eq = (k[:, :, d:] == k[:, :, :-d]).double().mean((1, 2))
        p = same_disk_probability(d).item()
        z = (eq.mean().item() - (p + (1 - p) / 256)) / (eq.std().item() / math.sqrt(len(eq)))
        assert abs(z) < 4, (d, z)


def test_gaussian_log_likelihood():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(5, 5, generator=g, dtype=torch.float64)
    tr, ho = torch.randn(300, 5, generator=g, dtype=torch.float64) @ A, torch.randn(7, 5, generator=g, dtype=torch.float64) @ A
    ref = torch.distributions.MultivariateNormal(tr.mean(0), torch.cov(tr.T, correction=0)).log_prob(ho)
    assert torch.allclose(gaussian_log_likelihood(tr, ho), ref, atol=1e-8)
    with pytest.raises(ValueError, match='more than'): gaussian_log_likelihood(tr[:5], ho)


def test_gpu_config_is_the_papers_network():
    cfg = DEAD_LEAVES_GPU.config
    ref = IMAGE_CONFIGS['dead_leaves']
    assert cfg['T'] == 1000 and (1, cfg['size'], cfg['size']) == ref['image_shape']
    for k in ('n_scales', 'conv_channels', 'conv_layers', 'hidden_1x1', 'layers_1x1'):
        assert cfg[k] == ref[k], k


def test_experiment_small_and_bad_input(monkeypatch):
    monkeypatch.setenv('DPM_SMALL', '1')
    cfg = dict(DEAD_LEAVES.resolve(), seed=0)
    d, rev = _build(cfg)
    assert rev.event_shape == (1, cfg['size'], cfg['size'])
    assert d.scaler_shift.item() == 0.5 and abs(d.scaler_scale.item() - 12 ** 0.5) < 1e-12
    train, held = _data(cfg, 0)
    assert abs(train.mean().item()) < 0.05 and abs(train.std().item() - 1) < 0.05
    res = _evaluate(d, rev, cfg, held)
    assert res['K_bits'] < res['ceiling_bits'] and res['n_heldout'] == cfg['n_eval']
    with pytest.raises(ValueError, match='divisible'): _build(dict(cfg, size=10, n_scales=3))
    x = held[:2].clone(); x[0, 0, 0, 0] = float('nan')
    with pytest.raises(ValueError, match='NaN'): d.bound(rev, x)


@pytest.mark.parametrize('sigma', [torch.tensor(12 ** -0.5),                       # float32
                                   torch.tensor(12 ** -0.5).bfloat16().float()])  # a bf16 shard's
def test_model_file_of_older_names_loads(monkeypatch, tmp_path, sigma):
    "A model file that named the scaler data_shift, data_scale and stored sigma loads with s = 1/sigma."
    from dpm.experiments import save_model, load_model
    from dpm.checkpoints import atomic_save, upgrade_checkpoint
    import dpm.dead_leaves as dl
    monkeypatch.setenv('DPM_SMALL', '1')
    cfg = dict(DEAD_LEAVES.resolve(), seed=0)
    d, rev = _build(cfg)
    path = tmp_path / 'model.pt'
    save_model(path, DEAD_LEAVES, d, rev, cfg, dict(history=[], steps=0))
    ck = torch.load(path, weights_only=True)
    old = lambda k: k.replace('scaler_shift', 'data_shift').replace('scaler_scale', 'data_scale')
    was = {'scaler_shift': torch.tensor(0.5), 'scaler_scale': sigma}
    ck['model'] = {old(k): was[k.rsplit('.', 1)[-1]] if old(k) != k else v for k, v in ck['model'].items()}
    ck['signature'] = {old(k): v for k, v in ck['signature'].items()}
    atomic_save({k: v for k, v in ck.items() if k != 'checksum'}, path)
    assert any(k.endswith('data_scale') for k in torch.load(path, weights_only=True)['model'])
    d2, rev2, *_ = load_model(DEAD_LEAVES, path)
    assert d2.scaler_shift.item() == 0.5 and d2.scaler_scale.item() == 1 / dl.DATA_STD
    upgrade_checkpoint(path)                                 # `dpm upgrade`: today's names written
    assert not any(k.endswith('data_scale') for k in torch.load(path, weights_only=True)['model'])
    d3, *_ = load_model(DEAD_LEAVES, path)                    # and it still reads sigma as 1/s
    assert d3.scaler_scale.item() == 1 / dl.DATA_STD
    with pytest.warns(DeprecationWarning, match='DATA_STD'):
        assert dl.DATA_SCALE == dl.DATA_STD
