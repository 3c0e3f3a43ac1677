"""The faster training step computes the same step: the multi-scale sum of eq-net-msconv-fast against
its literal form (outputs and gradients, every memory format and precision the runs use), the
linear-Gaussian reverse model without `torch.unique` against the one with it, and, on a CUDA
device, a run whose step is replayed as one CUDA graph against the same run stepped eagerly.
The CUDA tests run in the GPU campaign (bench/gpu_campaign.sh) and are skipped elsewhere."""
import warnings
import pytest
import torch
import torch.nn.functional as F
from dpm.diffusion import GaussianDiffusion, GaussianSchedule
from dpm.image_network import ImageReverse, MultiScaleConv, LEAK
from dpm.training import TrainConfig, train
from dpm.settings import ConfigError
import dpm.posterior as posterior

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason='needs a CUDA device')


def both_forms(layer, x, per_scale, dtype=None):
    "Output and gradients (input, weights) of the fast and the literal sum, one random read-out."
    out = []
    for form in (layer._sum_scales, layer._sum_scales_direct):
        xg = x.detach().clone().requires_grad_()
        with torch.autocast(x.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            y = form(xg, per_scale)
        read = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y)
        out.append((y, torch.autograd.grad((y.float() * read.float()).sum(),
                                           [xg, *layer.parameters()])))
    return out


@pytest.mark.parametrize('fmt', [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize('variant', ['paper', 'reference'])
def test_multiscale_sum_fast_equals_literal(fmt, variant):
    "Dead leaves' layer shape (5 scales, 64x64, 100 channels, batch 4), float32: to float rounding."
    torch.manual_seed(0)
    layer = MultiScaleConv(100, 100, n_scales=5, variant=variant).to(memory_format=fmt)
    x = torch.randn(4, 100, 64, 64).contiguous(memory_format=fmt)
    act = (lambda h: h) if variant == 'paper' else (lambda h: F.leaky_relu(h, LEAK))
    (y1, g1), (y2, g2) = both_forms(layer, x, act)
    assert y1.is_contiguous(memory_format=fmt)
    torch.testing.assert_close(y1, y2, rtol=1e-5, atol=1e-5)
    for a, b in zip(g1, g2): torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_multiscale_sum_fast_in_bf16_is_as_accurate_as_literal():
    "Under bf16 autocast, as the GPU runs train: each form's error against float64 is of one size."
    torch.manual_seed(0)
    layer = MultiScaleConv(16, 16, n_scales=4, variant='reference')
    x = torch.randn(2, 16, 32, 32)
    act = lambda h: F.leaky_relu(h, LEAK)
    exact, _ = both_forms(layer.double(), x.double(), act)
    layer.float()
    fast, literal = both_forms(layer, x.to(torch.bfloat16), act, dtype=torch.bfloat16)
    err = lambda a, b: ((a.double() - b).abs().max() / b.abs().max()).item()
    for i, (f, l) in enumerate(zip([fast[0], *fast[1]], [literal[0], *literal[1]])):
        ref = exact[0] if i == 0 else exact[1][i - 1]
        assert err(f, ref) < 2 * err(l, ref) + 0.01, (i, err(f, ref), err(l, ref))


def test_a_run_steps_the_same_with_either_form(monkeypatch):
    "Eight steps of a conv ImageReverse with the literal form patched in: the same weights."
    def run():
        torch.manual_seed(0)
        d = GaussianDiffusion(GaussianSchedule(20, beta_1=1e-3))
        rev = ImageReverse(d, (1, 16, 16), pathway='conv', n_scales=3, conv_channels=8,
                           conv_layers=2, hidden_1x1=8, variant='reference')
        train(d, rev, torch.randn(256, 1, 16, 16), config=TrainConfig(steps=8, batch_size=16,
              eval_every=0), device='cpu', progress=False)
        return rev.state_dict()
    fast = run()
    monkeypatch.setattr(MultiScaleConv, '_sum_scales', MultiScaleConv._sum_scales_direct)
    literal = run()
    for k in fast: torch.testing.assert_close(fast[k], literal[k], rtol=1e-4, atol=1e-5)


def test_linear_gaussian_reverse_per_row_equals_distinct_steps(monkeypatch):
    "GaussianDataReverse on a GPU computes every row's own t: the same mean and variance."
    from dpm.baselines import LinearReverse, fit_eigen
    torch.manual_seed(0)
    d = GaussianDiffusion(GaussianSchedule(50, beta_1=1e-3))
    data = torch.randn(400, 1, 4, 4) @ torch.randn(4, 4) * 0.3
    for covariance in ('diagonal', 'eigen'):
        lin = LinearReverse(d, (1, 4, 4), fit_eigen(data.reshape(400, -1)), covariance)
        x, t = torch.randn(64, 1, 4, 4), torch.randint(2, 51, (64,))
        distinct = lin(x, t)
        monkeypatch.setattr(posterior, '_distinct_steps', lambda t: (t, lambda v: v))
        per_row = lin(x, t)
        monkeypatch.undo()
        for a, b in zip(distinct, per_row): torch.testing.assert_close(a, b)


def test_cuda_graph_is_refused_where_it_cannot_be_captured():
    "One line each: no CUDA device, several processes, RMSprop, a compiled network."
    from dpm.devices import check_graphable
    cuda = torch.device('cuda')
    for cfg, device, n_proc, words in [
            (TrainConfig(cuda_graph=True), torch.device('cpu'), 1, 'needs a CUDA device'),
            (TrainConfig(cuda_graph=True), cuda, 2, 'single process'),
            (TrainConfig(cuda_graph=True, optimizer='rmsprop'), cuda, 1, "optimizer='adam'"),
            (TrainConfig(cuda_graph=True, compile=True), cuda, 1, 'compiled network')]:
        with pytest.raises(ConfigError, match=words): check_graphable(cfg, device, n_proc)
    check_graphable(TrainConfig(cuda_graph=True), cuda, 1)               # this one can be
    if not CUDA:
        d = GaussianDiffusion(GaussianSchedule(10))
        rev = ImageReverse(d, (1, 8, 8), pathway='dense', dense_hidden=8, hidden_1x1=4, n_bumps=2)
        with pytest.raises(ConfigError, match='needs a CUDA device'):
            train(d, rev, torch.randn(32, 1, 8, 8), config=TrainConfig(steps=2, cuda_graph=True),
                  device='cpu', progress=False)


def _gpu_run(pathway: str, graph: bool, steps: int = 40, **extra):
    "A small image run on the GPU, eager or replayed; (final state dict, info)."
    torch.manual_seed(0); torch.cuda.manual_seed(0)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    d = GaussianDiffusion(GaussianSchedule(100, beta_1=1e-3))
    if pathway == 'conv':
        rev = ImageReverse(d, (1, 16, 16), pathway='conv', n_scales=3, conv_channels=16,
                           conv_layers=2, hidden_1x1=16, variant='reference')
    else:
        rev = ImageReverse(d, (1, 8, 8), pathway='dense', dense_hidden=64, dense_layers=3,
                           hidden_1x1=16, variant='reference', pixel_input=True)
    x = torch.randn(1024, *rev.event_shape, generator=torch.Generator().manual_seed(1))
    cfg = TrainConfig(steps=steps, batch_size=64, eval_every=0, ema=0.99, cuda_graph=graph,
                      lr_final=1.0, **extra)                 # a constant rate: any length resumes
    info = train(d, rev, x, config=cfg, device='cuda', progress=False)
    return {k: v.float().cpu() for k, v in rev.state_dict().items()}, info


@needs_cuda
@pytest.mark.parametrize('pathway,extra', [('dense', {}), ('dense', dict(amp='bf16')),
                                           ('conv', dict(amp='bf16', channels_last=True)),
                                           ('conv', dict(grad_clip=1.0))])
def test_cuda_graph_replays_the_eager_trajectory(pathway, extra):
    "The replayed step draws the same minibatches and noise and takes the same steps as eager."
    eager, info_e = _gpu_run(pathway, False, **extra)
    graph, info_g = _gpu_run(pathway, True, **extra)
    assert info_e['steps'] == info_g['steps'] == 40
    worst = max(((eager[k] - graph[k]).abs().max() / eager[k].abs().max().clamp(min=1e-12)).item()
                for k in eager)
    assert worst < 1e-3, f'largest relative difference of a tensor: {worst:.2e}'
    assert abs(info_e['running_bits'] - info_g['running_bits']) < 1e-3 * abs(info_e['running_bits'])


@needs_cuda
def test_cuda_graph_resumes_from_its_checkpoint(tmp_path):
    "A graphed run stopped at step 20 and resumed eagerly to 40 ends where an eager run ends."
    from dpm.training import load_checkpoint
    eager, _ = _gpu_run('dense', False)
    torch.manual_seed(0); torch.cuda.manual_seed(0)
    d = GaussianDiffusion(GaussianSchedule(100, beta_1=1e-3))
    rev = ImageReverse(d, (1, 8, 8), pathway='dense', dense_hidden=64, dense_layers=3,
                       hidden_1x1=16, variant='reference', pixel_input=True)
    x = torch.randn(1024, *rev.event_shape, generator=torch.Generator().manual_seed(1))
    ck = tmp_path / 'checkpoint.pt'
    for steps, graph in ((20, True), (40, False)):
        train(d, rev, x, config=TrainConfig(steps=steps, batch_size=64, eval_every=0, ema=0.99,
                                            cuda_graph=graph, lr_final=1.0), checkpoint=ck,
              device='cuda', progress=False)
    saved = load_checkpoint(ck)
    assert all(not isinstance(g['lr'], torch.Tensor) for g in saved['optimizer']['param_groups'])
    got = {k: v.float().cpu() for k, v in rev.state_dict().items()}
    worst = max(((eager[k] - got[k]).abs().max() / eager[k].abs().max().clamp(min=1e-12)).item()
                for k in eager)
    assert worst < 1e-3, worst


@needs_cuda
def test_a_step_that_cannot_be_captured_trains_eagerly():
    "A network that reads the device: found in the warm-up, no capture; the run says so, goes on."
    torch.manual_seed(0)
    d = GaussianDiffusion(GaussianSchedule(20, beta_1=1e-3))
    rev = ImageReverse(d, (1, 8, 8), pathway='dense', dense_hidden=16, hidden_1x1=4, n_bumps=2)
    features = rev.features
    rev.features = lambda x: (float(x.sum()), features(x))[1]       # a host read in every step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        info = train(d, rev, torch.randn(256, 1, 8, 8), device='cuda', progress=False,
                     config=TrainConfig(steps=10, batch_size=32, eval_every=0, cuda_graph=True))
    assert info['steps'] == 10
    assert any('could not be captured as a CUDA graph' in str(w.message) for w in caught)
    torch.randn(4, device='cuda')                  # the device's random generator still draws
