"""CIFAR-10 chapter (dpm.cifar10): units, the 8-bit bridge, Gaussian baselines, the experiments."""
import math
import pytest
import torch
from dpm.cifar10 import (CIFAR10, CIFAR10_GPU, L_NULL_BITS_PER_DIM, PAPER_K_BITS_PER_PIXEL,
                         PAPER_K_MINUS_L_NULL, bits_per_pixel, paper_to_8bit, crop, wiener_denoise,
                         wiener_mse, model_scaler, fit_scaler, denoising, _build, _data, _evaluate)
from dpm.dead_leaves import fit_gaussian, gaussian_log_prob
from dpm.image_network import IMAGE_CONFIGS


def _spd(D, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(D, D, generator=g, dtype=torch.float64)
    return A @ A.T / D + 0.1 * torch.eye(D, dtype=torch.float64), torch.randn(D, generator=g,
                                                                                 dtype=torch.float64)


def test_units_and_bridge():
    # Table 1: K - (K - L_null) = L_null per RGB pixel = 3 values (within the table's rounding)
    assert abs((PAPER_K_BITS_PER_PIXEL - PAPER_K_MINUS_L_NULL) - bits_per_pixel(L_NULL_BITS_PER_DIM)) < 0.1
    assert abs(L_NULL_BITS_PER_DIM + 0.5 * math.log2(2 * math.pi * math.e)) < 1e-12
    assert abs(paper_to_8bit(5.4, 0.25) - 4.2) < 1e-12         # 8 - 1.8 - log2(4)
    # larger sigma (less stretching) -> smaller Jacobian gain -> more bits; more K -> fewer bits
    assert paper_to_8bit(5.4, 0.26) > paper_to_8bit(5.4, 0.25) > paper_to_8bit(6.0, 0.25)
    with pytest.raises(ValueError, match='pixel_std'): paper_to_8bit(5.4, -1.0)


def test_wiener_is_gaussian_conditioning():
    S, m = _spd(6)
    y = torch.randn(4, 6, dtype=torch.float64)
    s2 = 0.7
    explicit = m + (y - m) @ (S @ torch.linalg.inv(S + s2 * torch.eye(6, dtype=torch.float64))).T
    assert torch.allclose(wiener_denoise(m, S, y, s2), explicit, atol=1e-10)
    post = S - S @ torch.linalg.inv(S + s2 * torch.eye(6, dtype=torch.float64)) @ S
    assert abs(wiener_mse(S, s2) - post.trace().item() / 6) < 1e-10
    assert torch.allclose(wiener_denoise(m, S, y, 1e-9), y, atol=1e-6)     # no noise: y itself
    assert torch.allclose(wiener_denoise(m, S, y, 1e9), m.expand_as(y), atol=1e-6)  # all noise: m
    with pytest.raises(ValueError, match='noise_var'): wiener_denoise(m, S, y, 0.0)


def test_gaussian_fit_and_likelihood():
    S, m = _spd(5, 1)
    x = torch.distributions.MultivariateNormal(m, S).sample((20_000,))
    m_hat, S_hat = fit_gaussian(x)
    assert torch.allclose(m_hat, m, atol=0.05) and torch.allclose(S_hat, S, atol=0.1)
    ref = torch.distributions.MultivariateNormal(m, S).log_prob(x[:7])
    assert torch.allclose(gaussian_log_prob(m, S, x[:7]), ref, atol=1e-8)
    with pytest.raises(ValueError, match='full covariance'): fit_gaussian(x[:5])


def test_crop():
    k = torch.arange(2 * 3 * 32 * 32).reshape(2, 3, 32, 32)
    assert crop(k, 16).shape == (2, 3, 16, 16) and crop(k, 16)[0, 0, 0, 0] == k[0, 0, 8, 8]
    for bad in (0, 33):
        with pytest.raises(ValueError, match='crop size'): crop(k, bad)


def test_gpu_configuration_is_the_papers():
    cfg = CIFAR10_GPU.config
    assert cfg['T'] == 1000 and cfg['size'] == 32
    for k, v in IMAGE_CONFIGS['cifar10'].items():
        if k not in ('image_shape', 'pathway'): assert cfg[k] == v, k


def test_small_experiment_end_to_end(monkeypatch):
    monkeypatch.setenv('DPM_SMALL', '1')
    cfg = CIFAR10.resolve(); cfg['seed'] = 0
    torch.manual_seed(0)
    d, reverse = _build(cfg)
    train_x, heldout = _data(cfg, 0)
    S = cfg['size']
    # the validation photograph's patches are out of the training set (eq-train-stop)
    assert len(train_x) < cfg['n_train'] and train_x.shape[1:] == heldout.shape[1:] == (3, S, S)
    assert abs(train_x.double().mean().item()) < 0.02 and abs(train_x.double().var().item() - 1) < 0.02
    assert model_scaler(d).scale == d.scaler_scale.item() and d.scaler_scale.dtype == torch.float64
    assert model_scaler(d) == fit_scaler(cfg, 0)           # the scaler the data were scaled with
    res = _evaluate(d, reverse, cfg, heldout)
    assert math.isfinite(res['K_bits']) and res['K_bits'] <= res['ceiling_bits']
    # the bridge applied to the measured K, in its own units
    expect = 8 - res['K_bits'] / 3 - math.log2(res['scaler_scale'])
    assert abs(res['bits_per_dim_8bit'] - expect) < 1e-9
    assert abs(res['K_minus_L_null_bits'] - (res['K_bits'] - bits_per_pixel(L_NULL_BITS_PER_DIM))) < 1e-9
    assert res['mse_wiener'] < res['mse_noisy'] and res['stand_in'] in (True, False)
    # the chapter's table: the baselines (bits per dimension) times 3 are the per-pixel numbers
    b = res['baselines']
    assert abs(bits_per_pixel(b['K_bits']) - res['K_bits']) < 1e-9
    assert abs(bits_per_pixel(b['gaussian_bits']) - res['gaussian_bits']) < 1e-6
    assert abs(b['K_minus_gaussian_bits'] - (b['K_bits'] - b['gaussian_bits'])) < 1e-9
    assert b['floor_bits'] > 0 and b['n_heldout'] == res['n_heldout']
    # grouped by photograph; L_null of the held-out crops themselves (eq-base-null), per RGB pixel
    assert 1 < b['n_groups'] < b['n_heldout']
    m2 = res['heldout_second_moment']
    lnull = 3 * (-0.5 * math.log2(2 * math.pi) - m2 / (2 * math.log(2)))
    assert abs(res['L_null_heldout_bits'] - lnull) < 1e-9
    assert abs(res['K_minus_L_null_heldout_bits'] - (res['K_bits'] - lnull)) < 1e-6
    # Figure 3: both recipes, the network and the perfect Gaussian model, and the target's numbers
    for k in ('network_paper_mean', 'network_noised_mean', 'gaussian_paper_mean',
              'gaussian_noised_mean', 'wiener'):
        assert math.isfinite(res[f'mse_{k}']), k
    assert abs(res['denoise_net_minus_gauss'] - (res['mse_network_noised_mean']
                                                 - res['mse_gaussian_noised_mean'])) < 1e-6
    den = denoising(d, reverse, heldout[:2], 1.0, 3)
    assert den['samples'].shape == (3, 2, 3, S, S) and 'mse_wiener' not in den
    assert set(den['posterior']) == {'network_paper', 'network_noised'}
    import matplotlib; matplotlib.use('Agg')
    from dpm.cifar10 import plot_figure3
    fig = plot_figure3(d, reverse, heldout, n=5, den=denoising(d, reverse, heldout[:3], 1.0, 1))
    assert fig.axes[0].get_subplotspec().get_gridspec().ncols == 3       # the columns of `den`


def test_cli_knows_the_experiments(monkeypatch, capsys):
    import dpm.cli
    monkeypatch.setattr(dpm.cli, 'EXPERIMENT_MODULES', dpm.cli.EXPERIMENT_MODULES + ('dpm.cifar10',))
    dpm.cli.main(['list'])
    out = capsys.readouterr().out
    assert 'cifar10 ' in out and 'cifar10_gpu' in out


def test_configurations_are_the_chapters_design():
    "Reference kernel, fixed schedule; linear path at book scale only (a 3072-dim eigenbasis)."
    for exp in (CIFAR10, CIFAR10_GPU):
        assert exp.config['variant'] == 'reference' and exp.config['learn_schedule'] is False
    assert CIFAR10.config['linear_path'] is True and CIFAR10_GPU.config['linear_path'] is False
    assert CIFAR10.config['beta_1'] == 1e-5
    assert CIFAR10.config['covariance'] == 'eigen' and CIFAR10.config['patience'] > 0
    assert 'covariance' not in CIFAR10_GPU.config and 'patience' not in CIFAR10_GPU.config


def test_beta_1_within_the_floor_budget_on_the_training_crops(monkeypatch):
    "eq-base-floor on the book-scale training crops: 1e-5 within 0.01 bits per dimension, 1e-3 not."
    from dpm.baselines import fit_eigen, floor_bits
    monkeypatch.delenv('DPM_SMALL', raising=False)
    cfg = {**CIFAR10.resolve(), 'seed': 0}
    fit = fit_eigen(_data(cfg, 0)[0])
    assert floor_bits(fit, cfg['beta_1']) <= 0.01 < floor_bits(fit, 1e-3)


def test_gpu_record_has_what_the_chapter_reads():
    "The committed paper-scale record: baselines in bits per dimension, 3 per RGB pixel."
    import json
    from dpm.experiments import repo_root
    p = repo_root() / 'results' / 'cifar10_gpu' / 'record.json'
    if not p.exists(): pytest.skip('no paper-scale record committed')
    rec = json.loads(p.read_text())
    num, b = rec['numbers'], rec['numbers']['baselines']
    for k in ('K_bits', 'K_bits_se', 'gaussian_bits', 'gaussian_bits_se', 'linear_bits',
              'linear_bits_se', 'K_minus_gaussian_bits', 'K_minus_gaussian_se',
              'K_minus_linear_bits', 'K_minus_linear_se', 'floor_bits'):
        assert math.isfinite(b[k]), k
    assert abs(bits_per_pixel(b['K_bits']) - num['K_bits']) < 1e-9
    for k in ('mse_sample', 'mse_wiener', 'mse_posterior_mean', 'n_denoise', 'beta_1'):
        assert math.isfinite(num[k]), k
    assert {'steps', 'train_seconds', 'stopped_early'} <= set(rec['training'])


def test_book_record_is_the_configured_model_photo_by_photo():
    """The committed book-scale record: made with the chapter's configuration (T, schedule, network),
    trained within 30 minutes, and its per-photograph rows add up to its K and Gaussian."""
    import json
    from dpm.experiments import repo_root
    from dpm.cifar10 import _CONFIG
    from dpm.data import PHOTOS_TEST
    rec = json.loads((repo_root() / 'results' / 'cifar10' / 'record.json').read_text())
    cfg, b = rec['config'], rec['numbers']['baselines']
    for k in ('T', 'beta_1', 'learn_schedule', 'variant', 'linear_path', 'covariance', 'size',
              'conv_channels'):
        assert cfg[k] == _CONFIG[k], k
    assert rec['training']['train_seconds'] <= 30 * 60
    rows = b['by_group']
    assert [r['group'] for r in rows] == list(range(len(PHOTOS_TEST)))
    assert sum(r['n'] for r in rows) == b['n_heldout']
    for key in ('K', 'gaussian', 'linear'):
        mean = sum(r['n'] * r[f'{key}_bits'] for r in rows) / b['n_heldout']
        assert mean == pytest.approx(b[f'{key}_bits'], abs=1e-9), key
