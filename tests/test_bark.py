"""Bark experiment (chapter 15): data, baselines, inpainting study and the CLI hooks at small scale."""
import json, math
import pytest
import torch
import dpm.cli as cli
from dpm.bark import (BARK, BARK_GPU, _build, _data, _evaluate, _figures, bark_levels, resized,
                      hole_mask, hole_of, autocovariance, lag_covariance, gaussian_inpaint,
                      harmonic_fill, histogram_distance, spectrum_distance, gaussian_log_likelihood,
                      ceiling_bits, bark_scaler, inpaint_study, inpaint_tiles)


@pytest.fixture(autouse=True)
def small(monkeypatch):
    monkeypatch.setenv('DPM_SMALL', '1')


def test_data_units_and_record():
    cfg = BARK.resolve()
    train_k, held_k, paint_k, rec = bark_levels(cfg)
    assert train_k.dtype == torch.uint8 and train_k.shape[1:] == (1, cfg['size'], cfg['size'])
    assert paint_k.shape[-1] == cfg['inpaint_size']
    from dpm.bark import _levels, inpaint_tiles               # every tile of each held-out crop
    R = cfg['inpaint_size']
    crops = _levels('inpaint', 1, cfg['size'], 4 * R, 0).images
    assert inpaint_tiles(cfg) == 4 and len(paint_k) == 16 * len(crops)
    assert torch.equal(paint_k[5], crops[0, :, R:2 * R, R:2 * R])          # row 1, column 1 of crop 0
    assert len(torch.unique(paint_k.flatten(1), dim=0)) == len(paint_k)    # distinct tiles
    assert rec.stand_in == ('not UIUC bark' in rec.name)
    train, held = _data(cfg, 0)
    assert abs(train.double().mean().item()) < 1e-3 and abs(train.double().var().item() - 1) < 1e-2
    assert ceiling_bits(bark_scaler(cfg)) == pytest.approx(8 - math.log2(bark_scaler(cfg).scale))
    d, _ = _build(cfg)                                   # the scaler the model stores is the data's
    assert (d.scaler_shift.item(), d.scaler_scale.item()) == (bark_scaler(cfg).shift,
                                                              bark_scaler(cfg).scale)


def test_experiment_configs_are_valid():
    for exp in (BARK, BARK_GPU):
        exp.resolve()
    gpu = BARK_GPU.config
    assert gpu['T'] == 500 and gpu['hole'] == 100 and gpu['inpaint_size'] % 2 ** (gpu['n_scales'] - 1) == 0
    assert gpu['n_train'] > gpu['size'] ** 2         # the full-covariance Gaussian needs it


def test_resized_network_is_the_same_function():
    cfg = BARK.resolve()
    d, rev = _build(cfg)
    x = torch.randn(2, 1, cfg['size'], cfg['size'])
    t = torch.tensor([2, d.T])
    big = resized(d, rev, cfg, cfg['size'])
    for a, b in zip(rev(x, t), big(x, t)): assert torch.allclose(a, b)
    with pytest.raises(ValueError, match='divisible'): resized(d, rev, cfg, cfg['size'] + 1)


def test_bad_input():
    with pytest.raises(ValueError, match='hole'): hole_mask(8, 0)
    with pytest.raises(ValueError, match='more than'):
        gaussian_log_likelihood(torch.randn(5, 1, 4, 4), torch.randn(2, 1, 4, 4))


def test_gaussian_conditioning_matches_dense_formula():
    g = torch.Generator().manual_seed(0)
    patches = torch.nn.functional.avg_pool2d(torch.randn(300, 1, 8, 8, generator=g, dtype=torch.float64), 3, 1, 1)
    mu, c = autocovariance(patches)
    R = 10
    grid = torch.stack(torch.meshgrid(torch.arange(R), torch.arange(R), indexing='ij'), -1).reshape(-1, 2)
    Sigma = lag_covariance(c, grid, grid)
    assert torch.linalg.eigvalsh(Sigma).min() > -1e-12                       # PSD (Bochner)
    x = torch.randn(3, 1, R, R, generator=g, dtype=torch.float64)
    known = hole_mask(R, 4)
    mean, _, pred = gaussian_inpaint(x, known, mu, c, border=R)
    k, h = known.flatten(), ~known.flatten()
    Sbb = Sigma[k][:, k] + 1e-9 * c.max() * torch.eye(int(k.sum()), dtype=torch.float64)
    ref = mu + (Sigma[h][:, k] @ torch.linalg.solve(Sbb, (x.flatten(1)[:, k] - mu).T)).T
    assert torch.allclose(mean.flatten(1)[:, h], ref, atol=1e-6)
    assert torch.equal(mean.flatten(1)[:, k], x.flatten(1)[:, k])
    assert 0 < pred < c.max()


def test_harmonic_fill_and_distances():
    known = hole_mask(16, 6)
    ramp = (torch.arange(16.0, dtype=torch.float64)[None, :] - 2 * torch.arange(16.0)[:, None])[None, None]
    assert torch.allclose(harmonic_fill(torch.where(known, ramp, 0.0), known), ramp, atol=1e-6)
    x = torch.randn(2, 1, 16, 16, dtype=torch.float64)
    assert histogram_distance(x, x + 0.5).sub(0.5).abs().max() < 1e-12
    assert spectrum_distance(x, x).abs().max() < 1e-12
    assert hole_of(x, known).shape[-2:] == (6, 6)


def test_evaluate_and_figures_small(tmp_path):
    cfg = dict(BARK.resolve(), seed=0)
    d, rev = _build(cfg)
    _, held = _data(cfg, 0)
    res = _evaluate(d, rev, cfg, held)
    assert res['K_bits'] < res['ceiling_bits'] and math.isfinite(res['K_bits_se'])
    assert res['K_minus_L_null_bits'] == pytest.approx(res['K_bits'] - res['L_null_bits'])
    ip = res['inpaint']
    assert set(ip) == {'noise', 'harmonic', 'gaussian_mean', 'gaussian_sample', 'diffusion',
                       'diffusion_mean', 'diffusion_noised', 'diffusion_noised_mean',
                       'gaussian_model_paper', 'gaussian_model_noised',
                       'gaussian_model_resampled'}
    n_fills = res['inpaint_info']['images'] * res['inpaint_info']['samples']
    for name in ('diffusion', 'diffusion_noised', 'gaussian_model_resampled'):
        assert ip[name]['fills'] == n_fills                      # a mean over fills, not one draw
        assert math.isfinite(ip[name]['spectrum_minus_gaussian_se'])
        assert ip[name]['spectrum_minus_gaussian_se'] > 0
    # grouped standard errors over blocks, and L_null of the held-out patches themselves
    assert 1 < res['n_groups'] <= res['n_heldout']
    m2 = res['heldout_second_moment']
    assert res['L_null_heldout_bits'] == pytest.approx(-0.5 * math.log2(2 * math.pi) - m2 / (2 * math.log(2)))
    assert res['K_minus_L_null_heldout_bits'] == pytest.approx(res['K_bits'] - res['L_null_heldout_bits'])
    assert all(math.isfinite(v['mse']) and v['mse'] >= 0 for v in ip.values())
    json.dumps(res)                                                   # the record is JSON
    figs = _figures(d, rev, cfg, held)
    assert len(figs) == res['inpaint_info']['images'] // inpaint_tiles(cfg) ** 2   # one per crop
    assert inpaint_study(d, rev, cfg, 0) is inpaint_study(d, rev, cfg, 0)     # shared, not redone


def test_cli_train_evaluate(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, 'EXPERIMENT_MODULES', tuple(cli.EXPERIMENT_MODULES) + ('dpm.bark',))
    out = tmp_path / 'run'
    cli.main(['train', 'bark', '--out', str(out), '--device', 'cpu', '--no-progress', '--set', 'steps=3'])
    cli.main(['evaluate', 'bark', '--out', str(out), '--device', 'cpu'])
    rec = json.loads((out / 'record.json').read_text())
    assert rec['numbers']['data'] and 'K_bits' in rec['numbers'] and rec['figures']
    assert (out / rec['figures'][0]).exists()


def test_heldout_tiles_do_not_overlap_and_are_grouped():
    from dpm.bark import heldout_groups
    cfg = BARK.resolve()
    _, held_k, _, _ = bark_levels(cfg)
    g = heldout_groups(cfg)
    assert len(g) == len(held_k) and g.unique().numel() > 1
    assert len(torch.unique(held_k.flatten(1), dim=0)) == len(held_k)      # no tile twice


def test_perfect_gaussian_model_of_the_whole_image():
    from dpm.bark import stationary_model, GAUSS_MODEL_MAX_D
    from dpm.diffusion import GaussianDiffusion, GaussianSchedule
    cfg = BARK.resolve()
    train, _ = _data(cfg, 0)
    mu, c = autocovariance(train)
    d = GaussianDiffusion(GaussianSchedule(10, beta_1=1e-3, learn=False))
    m = stationary_model(d, mu, c, 12)
    mean, var = m(torch.zeros(2, 1, 12, 12), torch.tensor([1, 10]))
    assert mean.shape == (2, 1, 12, 12) and (var > 0).all()
    side = int(GAUSS_MODEL_MAX_D ** 0.5) + 1
    with pytest.raises(ValueError, match='GAUSS_MODEL_MAX_D'): stationary_model(d, mu, c, side)


def test_fill_holes_is_inpaint_and_batched_is_the_network():
    from dpm.bark import fill_holes, Batched
    from dpm.posterior import inpaint
    cfg = BARK.resolve()
    d, rev = _build(cfg)
    _, held = _data(cfg, 0)
    x, known = held[:3], hole_mask(cfg['size'], cfg['size'] // 2)
    for recipe in ('paper', 'noised'):
        torch.manual_seed(1)
        ref = inpaint(d, rev, x, known.expand_as(x), recipe=recipe)
        torch.manual_seed(1)
        assert torch.equal(fill_holes(d, rev, x, known, (recipe,))[recipe], ref)
    torch.manual_seed(2)
    out = fill_holes(d, Batched(rev, 2 * cfg['size'] ** 2), x, known, resample=(3, 1, d.T))
    assert sorted(out) == ['noised', 'paper', 'resampled']
    assert all(torch.equal(f[..., known], x[..., known]) for f in out.values())
    with pytest.raises(ValueError, match='noised'): fill_holes(d, rev, x, known, ('paper',), (2, 1, 2))
    t = torch.randint(2, d.T + 1, (50,))
    xs = torch.randn(50, 1, cfg['size'], cfg['size'])
    with torch.no_grad():
        for a, b in zip(rev(xs, t), Batched(rev, 3 * cfg['size'] ** 2)(xs, t)):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_stationary_model_single_precision_matches_double():
    from dpm.bark import stationary_model
    from dpm.posterior import GaussianDataReverse
    from dpm.diffusion import GaussianDiffusion, GaussianSchedule
    cfg = BARK.resolve()
    train, _ = _data(cfg, 0)
    mu, c = autocovariance(train)
    d = GaussianDiffusion(GaussianSchedule(10, beta_1=1e-3, learn=False))
    R = 12
    grid = torch.stack(torch.meshgrid(torch.arange(R), torch.arange(R), indexing='ij'), -1).reshape(-1, 2)
    exact = GaussianDataReverse(d, torch.full((R * R,), float(mu)), lag_covariance(c, grid, grid))
    fast = stationary_model(d, mu, c, R)
    assert fast.lin_eigvecs.dtype == torch.float32
    x, t = torch.randn(3, 1, R, R, dtype=torch.float64), torch.tensor([2, 5, 10])
    (m64, v64), (m32, v32) = exact(x, t), fast(x.float(), t)
    assert ((m32 - m64).abs() / v64.sqrt()).max() < 1e-3 and ((v32 - v64).abs() / v64).max() < 1e-3
