"""A tiny image experiment for the tests: 1x8x8 or 3x8x8 Gaussian blobs and a two-layer conv reverse model."""
import torch
from torch import nn
from dpm.diffusion import GaussianDiffusion, GaussianSchedule
from dpm.reverse import ReverseModel
from dpm.experiments import Experiment


class ConvReverse(ReverseModel):
    def __init__(self, d, shape, width=8):
        super().__init__(d, shape)
        C = shape[0]
        self.net = nn.Sequential(nn.Conv2d(C + 1, width, 3, padding=1), nn.Tanh(), nn.Conv2d(width, 2 * C, 3, padding=1))

    def raw(self, xt, t):
        tt = (t.to(xt.dtype) / self.T).view(-1, 1, 1, 1).expand(-1, 1, *xt.shape[2:])
        return self.net(torch.cat([xt, tt], 1)).view(len(xt), 2, *self.event_shape)


def _build(cfg):
    d = GaussianDiffusion(GaussianSchedule(cfg['T']))
    return d, ConvReverse(d, (cfg['channels'], 8, 8), cfg['width'])


def _data(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(cfg['n_train'] + cfg['n_heldout'], cfg['channels'], 8, 8, generator=g)
    x = torch.nn.functional.avg_pool2d(x, 3, 1, 1) * 3                     # smooth, about unit variance
    return x[:cfg['n_train']], x[cfg['n_train']:]


IMAGE_TOY = Experiment('image_toy', 'test images 8x8', _build, _data,
                       dict(T=10, channels=1, width=8, n_train=256, n_heldout=64, steps=20, batch_size=32,
                            eval_every=10, eval_size=64, checkpoint_every=10))
