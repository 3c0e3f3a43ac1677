"""Data, exact log-likelihoods and bad-input errors of the toy experiments (fast; no training)."""
import math
import pytest
import torch
from dpm.swiss_roll import sample_swiss_roll, true_log_likelihood as sr_ll, geometric_schedule
from dpm.heartbeat import heartbeats, sample_heartbeats, is_heartbeat, true_log_likelihood as hb_ll, diffusion, align
from dpm.reverse import RBFReverse, MLPReverse, HeartbeatReverse, PerStepLinear
from dpm.diffusion import GaussianDiffusion
from dpm.checkpoints import CheckpointError, atomic_save
from dpm.training import TrainConfig, train, load_checkpoint


def test_swiss_roll_data():
    x = sample_swiss_roll(50_000, generator=torch.Generator().manual_seed(0))
    assert x.shape == (50_000, 2) and abs(x.pow(2).mean().item() - 1) < 0.02
    ll = sr_ll(x[:200])
    assert torch.isfinite(ll).all()
    with pytest.raises(ValueError): sr_ll(x[:10], noise=0)


def test_heartbeat_data():
    h = heartbeats()
    assert h.shape == (5, 20) and (h.sum(1) == 4).all() and abs(h.mean().item() - 0.2) < 1e-6
    x = sample_heartbeats(1000, torch.Generator().manual_seed(0))
    assert is_heartbeat(x).all()
    assert torch.allclose(hb_ll(x), torch.full((1000,), -math.log(5)))
    bad = x.clone(); bad[0, 0] = 1 - bad[0, 0]
    assert not is_heartbeat(bad)[0] and hb_ll(bad)[0] == -math.inf
    assert (align(x)[:, 0] == 1).all()


def test_models_reject_bad_input():
    d = GaussianDiffusion(geometric_schedule(10, 1e-5))
    with pytest.raises(ValueError, match='expected xt of shape'): RBFReverse(d)(torch.randn(3, 4), torch.full((3,), 2))
    with pytest.raises(ValueError, match='time steps'): MLPReverse(d)(torch.randn(3, 2), torch.full((3,), 11))
    with pytest.raises(ValueError, match='readout'): HeartbeatReverse(diffusion(10), readout='nope')
    with pytest.raises(ValueError, match='NaN'):
        train(d, MLPReverse(d), torch.full((10, 2), float('nan')), config=TrainConfig(steps=1), progress=False)
    bd = diffusion(10)
    with pytest.raises(ValueError, match='binary'):
        train(bd, HeartbeatReverse(bd), torch.rand(10, 20), config=TrainConfig(steps=1), progress=False)


def test_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match='does not exist'): load_checkpoint(tmp_path / 'none.pt')
    atomic_save({'format': 'something else'}, tmp_path / 'x.pt')
    with pytest.raises(CheckpointError, match='not a dpm checkpoint'): load_checkpoint(tmp_path / 'x.pt')
    assert [p.name for p in tmp_path.iterdir()] == ['x.pt']          # no temporary files left behind


def test_stale_stored_model_is_retrained_not_a_crash(tmp_path, monkeypatch):
    "A model.pt written by an older version (its config lacks a key the builder needs) is a CheckpointError."
    from dpm.swiss_roll import SWISS_ROLL
    from dpm.experiments import load_model, build, save_model
    monkeypatch.setenv('DPM_SMALL', '1')
    cfg = SWISS_ROLL.resolve(); cfg['seed'] = 0
    d, rev = build(SWISS_ROLL, cfg, 0, 'cpu')
    save_model(tmp_path / 'model.pt', SWISS_ROLL, d, rev, cfg, {})
    load_model(SWISS_ROLL, tmp_path / 'model.pt', cfg)                             # the current version loads
    ck = load_checkpoint(tmp_path / 'model.pt')
    del ck['config']['readout']                                                     # as written before bump readouts
    atomic_save(ck, tmp_path / 'old.pt')
    with pytest.raises(CheckpointError, match='cannot build'): load_model(SWISS_ROLL, tmp_path / 'old.pt', cfg)


def _axes():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt.subplots()


def test_draw_reverse_step_scrubs_the_swiss_roll_trajectory():
    """The frame function of chapter 07's slider/animation: draws, changes with t, refuses bad t."""
    from dpm.swiss_roll import draw_reverse_step
    d = GaussianDiffusion(geometric_schedule(10, 1e-3))
    reverse = MLPReverse(d)
    torch.manual_seed(0)
    traj = d.sample(reverse, (50, 2), return_trajectory=True)
    fig, ax = _axes()
    try:
        assert torch.equal(draw_reverse_step(ax, d, reverse, traj, 10), traj[:, 10])
        assert len(ax.collections) == 2                               # samples and drift arrows
        first = ax.collections[0].get_offsets().copy()
        draw_reverse_step(ax, d, reverse, traj, 0)
        assert len(ax.collections) == 1 and not (first == ax.collections[0].get_offsets()).all()
        for bad in (-1, 11, 1.5, True):
            with pytest.raises(ValueError, match='t must be'): draw_reverse_step(ax, d, reverse, traj, bad)
        with pytest.raises(ValueError, match='traj must be'): draw_reverse_step(ax, d, reverse, traj[:, :5], 2)
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)


def test_draw_reverse_bits_scrubs_the_heartbeat_trajectory():
    """The frame function of chapter 08's slider/animation: draws, changes with t, refuses bad t."""
    from dpm.heartbeat import draw_reverse_bits
    d = diffusion(10)
    torch.manual_seed(0)
    traj = d.sample(HeartbeatReverse(d), (30, 20), return_trajectory=True)
    fig, ax = _axes()
    try:
        x10, x0 = draw_reverse_bits(ax, traj, 10), draw_reverse_bits(ax, traj, 0)
        assert len(ax.images) == 1 and not torch.equal(x10, x0)
        assert ax.images[0].get_array().shape == (30, 20)
        for bad in (-1, 11, 0.5, False):
            with pytest.raises(ValueError, match='t must be'): draw_reverse_bits(ax, traj, bad)
        with pytest.raises(ValueError, match='traj must be'): draw_reverse_bits(ax, traj[0], 0)
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)


def test_heartbeat_phase_entropy_and_ceiling():
    """eq-hb-phase-entropy against brute force on short heartbeats; the 0.03-bit beta_1 is consistent."""
    import itertools
    from dpm.heartbeat import phase_entropy_bits, ceiling_gap_bits, beta_1_for_gap
    b1, p = 0.1, 0.2
    seqs = heartbeats(10).double()
    x1 = torch.tensor(list(itertools.product([0.0, 1.0], repeat=10)), dtype=torch.float64)
    p_one = seqs * (1 - (1 - p) * b1) + (1 - seqs) * p * b1
    q = (x1 @ p_one.log().T + (1 - x1) @ (1 - p_one).log().T).exp()
    h = -(q / 5 * (q / q.sum(1, keepdim=True)).log()).sum().item() / math.log(2)
    assert abs(h - phase_entropy_bits(b1, p, 5, 2)) < 1e-12
    assert 0 < phase_entropy_bits(1 / 2000) < 1e-11                  # about 7e-13 bits at the paper's beta_1
    b = beta_1_for_gap(0.03)
    assert abs(ceiling_gap_bits(b) - 0.03) < 1e-9 and ceiling_gap_bits(1 / 2000) > 0.03
    with pytest.raises(ValueError): phase_entropy_bits(0.0)
    with pytest.raises(ValueError): beta_1_for_gap(-1)


def test_pruned_quadrature_equals_the_sum_over_every_node():
    "eq-sr-prune leaves out only terms below e^-40 of the largest: the same log q to 1e-12."
    from dpm.swiss_roll import roll_moments, roll_curve, _quadrature_nodes
    g = torch.Generator().manual_seed(4)
    for noise, m in ((0.02, 4000), (0.3, 1000), (2.0, 999)):        # m not a multiple of the block
        x = torch.cat([sample_swiss_roll(100, noise, g), 3 * torch.randn(30, 2, generator=g)])
        centre, c = roll_moments(noise)
        gamma, s2 = (roll_curve(_quadrature_nodes(m)) - centre) / c, (noise / c) ** 2
        every = torch.logsumexp(-0.5 * ((x.double()[:, None] - gamma) ** 2).sum(-1) / s2, 1) \
                - math.log(m) - math.log(2 * math.pi * s2)
        rel = (sr_ll(x, noise, m=m, batch=37) - every).abs() / every.abs().clamp(min=1)
        assert rel.max() < 1e-12, (noise, rel.max())


def test_optimal_heartbeat_kernel_matches_its_definition():
    "eq-hb-oracle-fast against eq-hb-oracle (five marginals, five posteriors), every step."
    from dpm.heartbeat import OptimalReverse
    from dpm.reverse import PROB_EPS
    d = diffusion(50)
    oracle = OptimalReverse(d, heartbeats())
    g = torch.Generator().manual_seed(6)
    t = torch.randint(1, 51, (3000,), generator=g)
    xt = d.draw(d.marginal(sample_heartbeats(3000, g), t), torch.rand(3000, 20, generator=g))
    x0s = [phi.expand_as(xt) for phi in heartbeats()]
    w = torch.softmax(torch.stack([d.log_prob(xt, d.marginal(x0, t)) for x0 in x0s], 1), 1)
    direct = (w[..., None] * torch.stack([d.posterior(x0, xt, t) for x0 in x0s], 1)).sum(1)
    assert torch.allclose(oracle(xt, t), direct.clamp(PROB_EPS, 1 - PROB_EPS), atol=1e-5)
    with pytest.raises(ValueError, match='binary'): OptimalReverse(d, 0.5 * heartbeats())


def test_bound_by_step_runs_gives_the_same_terms():
    "The bound's per-step calls of a bump/per-step readout change no number (same draws)."
    from dpm.bound import kl_terms
    torch.manual_seed(0)
    d = diffusion(30)
    for net in (HeartbeatReverse(d, 20, 16, 3, 'bumps', 4), MLPReverse(
            GaussianDiffusion(geometric_schedule(30, 1e-3)), 2, 16, 2, readout='per_step')):
        dd = net.diffusion
        x0 = sample_heartbeats(40) if dd is d else torch.randn(40, 2)
        x0r, ts = x0.repeat(29, 1), torch.arange(2, 31).repeat_interleave(40)
        xt = dd.draw(dd.marginal(x0r, ts))                         # one draw for both ways
        with torch.no_grad():
            a, b = kl_terms(dd, net, x0r, ts, xt=xt), kl_terms(dd, net, x0r, ts, xt=xt, runs=29)
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
