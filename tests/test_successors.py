"""The successors' kernels and losses (dpm.successors): the eps mean against the forward posterior,
L_simple's weights recovered from the bound's KL terms, the interpolated variance's bounds, the
cosine schedule's endpoints, clear errors on bad input; and the study of dpm.factorial: its
forward process, its records, and the rules of a verdict."""
import math

import pytest
import torch

from dpm.diffusion import GaussianDiffusion, GaussianSchedule
from dpm.reverse import MLPReverse
from dpm.image_network import reference_kernel
from dpm.successors import (BANDS, SuccessorReverse, band_ranges, clipped_mean,
                            compare_variants, cosine_schedule, eps_mean, implied_eps,
                            interpolated_variance, k_bands, linear_schedule,
                            posterior_variance, posterior_variances, predicted_x0, rescale_bits,
                            simple_weights, skip_eps, successor_loss, train_budget, with_fixes,
                            step_probabilities, weighted_steps)
from dpm.factorial import (CELLS, STUDY_T, check_study, compare, curve_difference, pack_values,
                           per_seed, read_records, run_cell, schedule_facts, seed_test,
                           study_schedule, unpack_values, verdict, draws_the_data, parzen_bits)

VARIANTS = {'paper': ('paper', 'learned', 'K'), 'reference': ('reference', 'learned', 'K'),
            'eps_tilde': ('eps', 'beta_tilde', 'K'), 'ddpm': ('eps', 'beta_tilde', 'simple'),
            'iddpm': ('eps', 'interp', 'hybrid'), 'skip': ('eps_skip', 'interp', 'hybrid')}


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
    for name, (mean, variance, loss) in VARIANTS.items():
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
    with pytest.raises(ValueError, match="mean='paper'"): _model(d, 'paper', 'beta')
    with pytest.raises(ValueError, match="mean='paper'"):
        SuccessorReverse(MLPReverse(d, 2, 16, 1), 'paper', 'learned', fix_first=True)
    with pytest.raises(ValueError, match='lo < hi'):
        SuccessorReverse(MLPReverse(d, 2, 16, 1), 'eps', clip_x0=(0, 0))
    with pytest.raises(ValueError, match='loss'):
        successor_loss(d, _model(d), torch.randn(4, 2), torch.full((4,), 2), torch.randn(4, 2), 'l1')
    with pytest.raises(ValueError, match='interp'):
        successor_loss(d, _model(d), torch.randn(4, 2), torch.full((4,), 2), torch.randn(4, 2), 'hybrid')
    with pytest.raises(ValueError, match='T must'): cosine_schedule(1)
    with pytest.raises(ValueError, match='beta'): simple_weights(d, 'learned')
    with pytest.raises(TypeError): SuccessorReverse(torch.nn.Linear(2, 2))


def test_compare_variants_pairs_two_kernels():
    d = _d(8)
    torch.manual_seed(0)
    trunk = MLPReverse(d, 2, 16, 1, readout='bumps')
    models = {'reference': SuccessorReverse(trunk, 'reference', 'learned'),
              'ddpm': SuccessorReverse(trunk, 'eps', 'beta_tilde')}
    x = torch.randn(200, 2)
    r = train_budget(models['ddpm'], 'simple', x, 3, 16)
    assert r['steps'] == 3 and r['seconds_per_step'] > 0
    out = compare_variants(models, x[:50])
    assert out['reference']['minus_reference_bits'] == 0.0
    assert math.isfinite(out['ddpm']['minus_reference_se']) and len(out['ddpm']['kl_t_bits']) == 7


def test_implied_eps_inverts_the_eps_mean():
    d = _d()
    xt, eps, mu = (torch.randn(50, 2, dtype=torch.float64) for _ in range(3))
    t = torch.randint(2, d.T + 1, (50,))
    torch.testing.assert_close(implied_eps(d, xt, eps_mean(d, xt, eps, t), t), eps)
    torch.testing.assert_close(eps_mean(d, xt, implied_eps(d, xt, mu, t), t), mu)


def test_eps_skip_starts_at_the_reference_mean():
    "At z_mu = 0 the mean through eq-succ-skip is x_t sqrt(1 - beta_t), the reference's at z = 0."
    d, xt = _d(), torch.randn(50, 2, dtype=torch.float64)
    t = torch.randint(2, d.T + 1, (50,))
    beta = d.betas[t - 1][:, None]
    mean = eps_mean(d, xt, skip_eps(d, xt, torch.zeros_like(xt), t), t)
    torch.testing.assert_close(mean, xt * (1 - beta).sqrt())
    torch.testing.assert_close(mean, reference_kernel(xt, 0 * xt, 0 * xt, beta, d.T)[0])
    m = _model(d, 'eps_skip', 'beta_tilde')
    x, tt = torch.randn(8, 2), torch.randint(2, d.T + 1, (8,))
    path = d.one_minus_alphas_bar()[tt].sqrt().float()[:, None] * x
    torch.testing.assert_close(m.eps(x, tt), path + m.trunk.raw(x, tt)[:, 0])


def test_the_reference_mean_takes_every_variance_and_every_loss():
    d = _d()
    x0, t, noise = torch.randn(16, 2), torch.randint(2, d.T + 1, (16,)), torch.randn(16, 2)
    for variance in ('learned', 'beta', 'beta_tilde', 'interp'):
        m = _model(d, 'reference', variance)
        xt = d.draw(d.marginal(x0, t), noise)
        mean, var = m(xt, t)
        z = m.trunk.raw(xt, t)
        torch.testing.assert_close(mean, reference_kernel(xt, z[:, 0], z[:, 1],
                                                          d.betas[t - 1].float()[:, None], d.T)[0])
        want = ((noise - implied_eps(d, xt, mean, t)) ** 2).mean(1)
        torch.testing.assert_close(successor_loss(d, m, x0, t, noise, 'simple'), want,
                                   rtol=1e-3, atol=1e-3)
        if variance in ('learned', 'interp'):
            assert torch.isfinite(successor_loss(d, m, x0, t, noise, 'hybrid')).all()
        else:
            with pytest.raises(ValueError, match='interp'):
                successor_loss(d, m, x0, t, noise, 'hybrid')


def test_the_fixes():
    d = _d()
    m = _model(d, 'eps', 'beta_tilde')
    x, t = torch.randn(64, 2), torch.randint(3, d.T + 1, (64,))
    t[:8] = 2                                                      # the first 8 rows only
    mean, var = m(x, t)
    mean_f, var_f = with_fixes(m, fix_first=True)(x, t)
    assert with_fixes(m, True).trunk is m.trunk
    torch.testing.assert_close(mean_f, mean)
    torch.testing.assert_close(var_f[8:], var[8:])
    torch.testing.assert_close(var_f[:8], d.betas[1].float().expand(8, 2))
    mean_w = with_fixes(m, clip_x0=(-1e9, 1e9))(x, t)[0]           # nothing clipped: unchanged
    torch.testing.assert_close(mean_w, mean, rtol=1e-4, atol=1e-4)
    x0, eps = torch.rand(64, 2, dtype=torch.float64) * 2 - 1, torch.randn(64, 2, dtype=torch.float64)
    xt = d.draw(d.marginal(x0, t), eps)
    torch.testing.assert_close(predicted_x0(d, xt, eps, t), x0)
    bad = eps_mean(d, xt, eps + 5, t)
    err = (clipped_mean(d, xt, bad, t, -1, 1) - d.posterior(x0, xt, t)[0]).abs()
    assert (err <= 2 * d.posterior_coefficients()[0][t - 1][:, None] + 1e-12).all()


def test_the_last_step_of_the_cosine_schedule_amplifies_31_fold():
    d = GaussianDiffusion(cosine_schedule(1000))
    xt, eps = torch.randn(8, 2, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    t = torch.full((8,), 1000)
    gain = (eps_mean(d, xt, eps, t) - eps_mean(d, xt, eps + 1e-6, t)) / 1e-6
    assert d.betas[-1].item() == pytest.approx(0.999)
    torch.testing.assert_close(gain, torch.full_like(gain, 31.6), rtol=2e-3, atol=0)


def test_linear_schedule():
    for T in (40, 100, 1000):
        b = linear_schedule(T)
        assert b.shape == (T,) and (b[1:] > b[:-1]).all()
        assert b[0].item() == pytest.approx(0.1 / T) and b[-1].item() == pytest.approx(20 / T)
        assert torch.prod(1 - b).item() < math.exp(-10.05)
    assert linear_schedule(1000, beta_1=5e-6)[0].item() == 5e-6
    assert linear_schedule(10).max().item() == pytest.approx(0.999)          # capped
    with pytest.raises(ValueError, match='T must'): linear_schedule(1)
    with pytest.raises(ValueError, match='start < end'): linear_schedule(100, start=0.5)


def test_k_bands_split_the_kl_terms_exactly():
    kl = torch.rand(5, 99, dtype=torch.float64)
    bands = k_bands(kl, 100)
    assert tuple(bands) == BANDS
    torch.testing.assert_close(sum(bands.values()), kl.sum(1))
    assert band_ranges(100) == {'t = 2': (2, 2), 'small t': (3, 10), 'middle': (11, 99),
                                't = T': (100, 100)}
    torch.testing.assert_close(bands['t = T'], kl[:, -1])
    with pytest.raises(ValueError, match='T >= 5'): band_ranges(4)
    with pytest.raises(ValueError, match='N, T-1'): k_bands(kl, 50)


def test_compare_variants_band_differences_against_a_hand_computation():
    d = _d(12)
    torch.manual_seed(0)
    trunk = MLPReverse(d, 2, 16, 1, readout='bumps').double()
    models = {'a': SuccessorReverse(trunk, 'reference', 'beta'),
              'b': SuccessorReverse(trunk, 'eps_skip', 'beta_tilde')}
    x = torch.randn(100, 2, dtype=torch.float64)
    out = compare_variants(models, x, 'a', seed=3)['b']
    assert sum(out['minus_reference_bands_bits'].values()) == pytest.approx(
        out['minus_reference_bits'], abs=1e-10)                    # prior and first cancel
    from dpm.baselines import paired_bounds
    kl = {k: v['kl'] for k, v in paired_bounds(d, models, x, 3).items()}
    for band, (lo, hi) in band_ranges(12).items():
        diff = (kl['a'][:, lo - 2:hi - 1].sum(1) - kl['b'][:, lo - 2:hi - 1].sum(1)) / math.log(2) / 2
        assert out['minus_reference_bands_bits'][band] == pytest.approx(diff.mean().item())
        assert out['minus_reference_bands_se'][band] == pytest.approx(
            diff.std().item() / math.sqrt(len(diff)))
    r = rescale_bits(dict(out, T=12), 2.0)                         # bits per point of 2-D data
    assert r['K_bits'] == 2 * out['K_bits'] and r['K_bits_se'] == 2 * out['K_bits_se']
    assert r['bands_bits']['middle'] == 2 * out['bands_bits']['middle'] and r['T'] == 12
    assert r['kl_t_bits'] == [2 * v for v in out['kl_t_bits']]


def test_the_study_runs_on_one_forward_process_without_a_jump():
    s = study_schedule()
    f = schedule_facts(s['betas'])
    assert f['T'] == STUDY_T and f['beta_2_over_beta_1'] <= 2 + 1e-9 and f['beta_T'] <= 0.1
    j = schedule_facts(study_schedule('jump')['betas'])
    assert j['beta_2_over_beta_1'] == pytest.approx(200) and j['beta_2'] == f['beta_2']
    with pytest.raises(ValueError, match="'linear' or 'jump'"): study_schedule('cosine')
    assert CELLS['unet-eps-tilde-simple'][0] == 'unet'


def test_train_budget_stops_at_the_first_budget_and_scores_checkpoints():
    d = _d(8)
    m = _model(d, 'eps_skip', 'beta_tilde')
    seen = []
    r = train_budget(m, 'simple', torch.randn(100, 2), 7, 8, checkpoints=(2, 5),
                     at_checkpoint=lambda avg: seen.append(1) or dict(score=len(seen)))
    assert r['steps'] == 7 and [p['steps'] for p in r['curve']] == [2, 5]
    assert [p['score'] for p in r['curve']] == [1, 2] and r['cpu_per_step'] > 0
    r = train_budget(_model(d, 'eps_skip', 'beta_tilde'), 'simple', torch.randn(100, 2), 10**6, 8,
                     seconds=0.05)
    assert 1 <= r['steps'] < 10**6 and r['cpu_seconds'] >= 0.05


def test_run_cell_writes_one_self_describing_record_and_resumes(tmp_path):
    with pytest.raises(ValueError, match='no cell'): run_cell('swiss_roll', 'unet-eps-tilde-simple')
    kw = dict(steps=8, out=tmp_path, n_eval=40, n_curve=20, n_samples=40)
    r = run_cell('swiss_roll', 'eps-tilde-K', **kw)
    files = list(tmp_path.glob('*.json'))
    assert [f.name for f in files] == ['swiss_roll-eps-tilde-K-linear-seed0.json']
    assert r['complete'] and r['steps'] == 8 and [p['steps'] for p in r['curve']] == [1, 2, 4, 8]
    for key in ('trunk', 'kernel', 'variance', 'loss', 'seed', 'machine', 'cpu_seconds'):
        assert key in r
    assert r['schedule']['name'] == 'linear' and r['schedule']['beta_2_over_beta_1'] <= 2 + 1e-9
    assert len(unpack_values(r['scores']['as_specified']['examples']['K'])) == 40
    mtime = files[0].stat().st_mtime_ns
    assert run_cell('swiss_roll', 'eps-tilde-K', **kw)['cell'] == r['cell']
    assert files[0].stat().st_mtime_ns == mtime                    # skipped, not rewritten
    assert list(read_records(tmp_path)['swiss_roll']) == ['eps-tilde-K']


def _fake(cell, seed, k, first=0.0, schedule='linear', cpu='one'):
    ex = {'K': k, 't = 2': first + 0 * k, 't = T': 0 * k, 'rest': k - first}
    kl_t = torch.zeros(11, dtype=torch.float64)
    kl_t[0], kl_t[5] = -(first + 0 * k).mean(), -(k - first).mean()
    return dict(cell=cell, seed=seed, data='swiss_roll', sizes={}, schedule={'name': schedule},
                steps=10, samples=dict(true_ll_bits=-1.3, coverage_bits=-1.5),
                machine=dict(processor=cpu),
                curve=[dict(steps=5, cpu_seconds=1.0, K_bits=0.0),
                       dict(steps=10, cpu_seconds=2.0, K_bits=seed * 0.01)],
                scores={'as_specified': {'examples': {p: pack_values(v) for p, v in ex.items()},
                                         'kl_t_bits': pack_values(kl_t)}})


def test_a_verdict_needs_five_seeds_p_below_001_and_the_effect():
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(200, generator=g, dtype=torch.float64) for _ in range(6)]
    gaps = [0.3, 0.35, 0.32, 0.28, 0.31, 0.33]
    a = [_fake('a', s, b + x) for s, (b, x) in enumerate(zip(base, gaps))]
    b = [_fake('b', s, v) for s, v in enumerate(base)]
    floors = dict(real=dict(true_ll_bits=-1.2, coverage_bits=-1.4),
                  gaussian=dict(true_ll_bits=-79.0, coverage_bits=-4.3))
    c = compare('swiss_roll', a, b, floors)
    assert c['verdict'] == ('higher', '') and c['K']['df'] == 5 and c['K']['p'] < 1e-4
    assert compare('swiss_roll', a[:4], b, floors)['verdict'][0] == 'no verdict'     # 4 seeds
    assert sum(c['shares'].values()) == pytest.approx(c['K']['diff'], abs=2e-3)
    carried = [_fake('a', s, v + x, first=x) for s, (v, x) in enumerate(zip(base, gaps))]
    cc = compare('swiss_roll', carried, b, floors)          # all of it at t = 2: still a verdict
    assert cc['verdict'] == ('higher', '') and cc['rest_verdict'][0] == 'no verdict'
    split = [_fake('a', s, v + x, first=2 * x) for s, (v, x) in enumerate(zip(base, gaps))]
    cs = compare('swiss_roll', split, b, floors)
    assert cs['sign_split'] and cs['rest_verdict'][0] == 'lower'
    small = [_fake('a', s, v + 0.01 * x) for s, (v, x) in enumerate(zip(base, gaps))]
    assert 'effect' in compare('swiss_roll', small, b, floors)['verdict'][1]
    assert c['draw'] == [True, True] and c['samples_verdict'][0] == 'no verdict'
    assert c['samples']['coverage_bits']['diff'] == 0.0
    assert c['equal_time']['seeds'] == 6
    assert 'equal_time' not in compare('swiss_roll', a, [dict(r, machine=dict(processor='two'))
                                                         for r in b], floors)
    with pytest.raises(ValueError, match='different forward processes'):
        per_seed(a, [_fake('b', 0, base[0], schedule='jump')])
    assert curve_difference(a, b) == {s: 0.0 for s in range(6)}
    t = seed_test([1.0, 2.0, 3.0, 4.0, 5.0])
    assert t['df'] == 4 and t['t'] == pytest.approx(3 / (math.sqrt(2.5) / math.sqrt(5)))
    with pytest.raises(ValueError, match='effect'): verdict(t, 0.0)
    with pytest.raises(ValueError, match='packed'): unpack_values('abc')


def test_a_collapsed_swiss_roll_does_not_draw_the_roll():
    floors = dict(real=dict(true_ll_bits=-1.2, coverage_bits=-1.4),
                  gaussian=dict(true_ll_bits=-79.0, coverage_bits=-4.3))
    on = [dict(samples=dict(true_ll_bits=-1.5, coverage_bits=-1.5))]
    collapsed = [dict(samples=dict(true_ll_bits=0.5, coverage_bits=-3.0))]
    assert draws_the_data('swiss_roll', on, floors)
    assert not draws_the_data('swiss_roll', collapsed, floors)
    assert not draws_the_data('swiss_roll', [dict(samples=dict(true_ll_bits=-1.5))], floors)
    x = torch.randn(300, 2, dtype=torch.float64)
    near = parzen_bits(x[:150], x[150:], 0.5).mean()
    assert near > parzen_bits(x[:150] + 5, x[150:], 0.5).mean()      # far points: lower


def test_importance_sampled_t_is_unbiased_and_uniform_probabilities_are_stratified():
    from dpm.training import stratified_steps
    d = GaussianDiffusion(linear_schedule(50))
    p = step_probabilities(d)
    assert p.sum().item() == pytest.approx(1) and p.argmax() == 0
    for seed in range(5):
        torch.manual_seed(seed); a = stratified_steps(64, 50)
        torch.manual_seed(seed)
        assert torch.equal(a, weighted_steps(64, step_probabilities(d, 'uniform')))
    t = weighted_steps(10_000, p)
    freq = torch.bincount(t - 2, minlength=49).double() / 10_000
    assert (freq - p).abs().max() < 2e-4
    m = _model(d, 'eps', 'beta_tilde').double()
    x0 = torch.randn(4, 2, dtype=torch.float64)
    noise = torch.randn(49, 4, 2, dtype=torch.float64)
    # the exact mean over t ~ p of the importance-sampled estimate is the uniform one's
    by_t = lambda probs: torch.stack([successor_loss(d, m, x0, torch.full((4,), tt), noise[tt - 2],
                                                     'K', probs) for tt in range(2, 51)])
    w_is, w_u = by_t(p), by_t(None)
    assert torch.allclose((p[:, None] * w_is).sum(0), w_u.mean(0), rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="loss='K'"):
        train_budget(m, 'simple', torch.randn(50, 2), 2, 4, sampling='weights')
    with pytest.raises(ValueError, match='sampling must be'): step_probabilities(d, 'other')


def test_committed_study_records_describe_themselves():
    "Every committed record of chapter 15b says what it is, where it ran, and matches its name."
    import json
    from dpm.factorial import study_dir
    paths = sorted(study_dir().glob('*-seed*.json'))
    assert paths, 'no committed records of the study'
    for p in paths:
        r = json.loads(p.read_text())
        assert p.stem == f"{r['data']}-{r['cell']}-{r['schedule']['name']}-seed{r['seed']}", p
        assert CELLS[r['cell']][:4] == (r['trunk'], r['kernel'], r['variance'], r['loss']), p
        assert CELLS[r['cell']][4] == r.get('sampling', 'uniform'), p
        s = r['schedule']
        assert {'T', 'beta_1', 'beta_2', 'beta_T', 'beta_2_over_beta_1'} <= set(s), p
        assert r['complete'] and not r['small'] and r['threads'] == 1, p
        assert {'processor', 'platform', 'torch'} <= set(r['machine']), p
        assert math.isfinite(r['scores']['as_specified']['K_bits']), p
    assert check_study() == []


def _copy_study(tmp_path):
    import shutil
    from dpm.factorial import study_dir
    for p in study_dir().glob('*-seed*.json'): shutil.copy(p, tmp_path / p.name)
    return tmp_path


def _edit(path, change):
    "Change a record and sign it again, as an editor with the tool would: the check must tell."
    import json
    from dpm.readers import signed
    r = json.loads(path.read_text()); change(r); path.write_text(json.dumps(signed(r)))


@pytest.mark.parametrize('defect, says', [
    ('beta_1', "not the forward process 'linear' (beta_1 0.001"),
    ('processor', 'seeds from more than one processor'),
    ('four seeds', 'seeds [0, 1, 2, 3]'),
    ('evaluation size', 'records with different sizes'),
    ('cell', 'not the cell'),
    ('small', 'incomplete, small'),
])
def test_the_record_check_catches_what_it_claims(tmp_path, defect, says):
    "A copy of the committed records with one defect: check_study names it; the copy is clean."
    d = _copy_study(tmp_path)
    assert check_study(d) == []
    one = d / 'swiss_roll-eps-tilde-simple-linear-seed2.json'
    if defect == 'beta_1': _edit(one, lambda r: r['schedule'].update(beta_1=1e-3))
    if defect == 'processor': _edit(one, lambda r: r['machine'].update(processor='Other CPU'))
    if defect == 'four seeds': (d / 'swiss_roll-eps-tilde-simple-linear-seed4.json').unlink()
    if defect == 'evaluation size': _edit(one, lambda r: r['sizes'].update(n_eval=1000))
    if defect == 'cell': _edit(one, lambda r: r.update(loss='K'))
    if defect == 'small': _edit(one, lambda r: r.update(small=True))
    problems = check_study(d)
    assert any(says in p for p in problems), problems
