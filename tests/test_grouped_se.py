"""Grouped (cluster) standard errors (chapter 10a, eq-base-cluster-se) and the held-out splits they serve."""
import math
import pytest
import torch
from dpm.baselines import grouped_se, paired, by_group
from dpm.data import load_cifar10, load_bark, PHOTOS_TEST, PHOTOS_TRAIN


def test_without_groups_it_is_the_naive_standard_error():
    v = torch.randn(50, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert grouped_se(v) == pytest.approx((v.mean().item(), v.std().item() / math.sqrt(50)))
    assert grouped_se(v, torch.arange(50)) == pytest.approx(grouped_se(v))


def test_design_effect_by_simulation():
    """Intra-group correlation rho: the naive variance is too small by 1 + (m - 1) rho, the grouped
    one is right on average (z-test at |z| < 4)."""
    G, m, rho, R = 10, 20, 0.2, 800
    gen = torch.Generator().manual_seed(1)
    v = (math.sqrt(rho) * torch.randn(R, G, 1, generator=gen, dtype=torch.float64)
         + math.sqrt(1 - rho) * torch.randn(R, G, m, generator=gen, dtype=torch.float64)).reshape(R, -1)
    groups = torch.arange(G).repeat_interleave(m)
    true_var = (1 + (m - 1) * rho) / (G * m)
    se2 = torch.tensor([grouped_se(r, groups)[1] ** 2 for r in v])
    naive2 = torch.tensor([grouped_se(r)[1] ** 2 for r in v])
    z = (se2.mean().item() - true_var) / (se2.std().item() / math.sqrt(R))
    assert abs(z) < 4, z
    assert true_var / naive2.mean().item() == pytest.approx(1 + (m - 1) * rho, rel=0.1)


def test_bad_input():
    with pytest.raises(ValueError, match='at least 2 groups'): grouped_se(torch.ones(5), torch.zeros(5))
    with pytest.raises(ValueError, match='group labels'): grouped_se(torch.ones(5), torch.zeros(4))
    assert paired(torch.ones(4), torch.ones(4), torch.tensor([0, 0, 1, 1])) == (0.0, 0.0)


def test_by_group_splits_the_mean():
    "Group sizes and means: their size-weighted mean is the overall mean; labels must match."
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(40, generator=gen, dtype=torch.float64), torch.randn(40, generator=gen)
    g = torch.tensor([3, 1, 1, 7] * 10)
    rows = by_group(dict(a=a, b=b), g, 4)
    assert [(r['group'], r['n']) for r in rows] == [(1, 20), (3, 10), (7, 10)]
    assert sum(r['n'] * r['a_bits'] for r in rows) / 40 == pytest.approx(a.mean().item() / math.log(2) / 4)
    assert rows[2]['b_bits'] == pytest.approx(b[g == 7].double().mean().item() / math.log(2) / 4)
    with pytest.raises(ValueError, match='group labels'): by_group(dict(a=a), g[:39], 4)


def test_cifar_standin_heldout_tiles():
    te = load_cifar10('test')
    assert torch.equal(te.groups, te.labels) and te.groups.unique().numel() == len(PHOTOS_TEST) >= 6
    assert not set(PHOTOS_TEST) & set(PHOTOS_TRAIN)
    assert len(torch.unique(te.images.flatten(1), dim=0)) == len(te.images)
    assert torch.equal(load_cifar10('test', n=100).images, te.images[:100])    # a prefix
    assert load_cifar10('train', n=10).groups is None


def test_bark_standin_heldout_tiles():
    te = load_bark('test', n=10 ** 6, patch=16)
    assert len(te.images) == 2 * 16 * 16 and te.groups.unique().numel() == 2 * 4 * 4
    assert len(torch.unique(te.images.flatten(1), dim=0)) == len(te.images)
