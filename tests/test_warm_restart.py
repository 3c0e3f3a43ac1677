"""A warm restart (a model file, a fresh optimiser) that fills its optimiser first (eq-train-prime)
leaves the held-out bound within the noise of a resumed run's, where a plain restart (warm_batches=0)
jumps: the swiss roll's experiment in a small, quickly converged form (DPM_SMALL), a first part at a
constant rate, then a few steps three ways from the same point: resumed from the checkpoint, warm-
restarted plainly, warm-restarted with its optimiser filled. The bounds are paired (the same held-out
points and noise for every model)."""
import math, os, shutil
import pytest
import torch

os.environ['DPM_SMALL'] = '1'
from dpm.diffusion import LN2
from dpm.experiments import run, load_model, experiment_data
from dpm.swiss_roll import SWISS_ROLL

FIRST = 4000                         # steps of the first part: Adam's v is no longer stale
AFTER = (2, 4, 8)                    # steps after the restart at which the bound is read
SETTINGS = dict(eval_every=0, lr=3e-3, lr_final=1.0, ema=None, checkpoint_every=10 ** 6,
                batch_size=128, T=10, width=32, depth=2, learn_schedule=False)


@pytest.fixture(scope='module')
def drops(tmp_path_factory):
    "For each way of going on: [(drop of the bound from the restart point, its paired SE)], bits."
    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp('warm')
    run(SWISS_ROLL, work / 'first', dict(SETTINGS, steps=FIRST), progress=False)
    shutil.copy(work / 'first' / 'model.pt', work / 'restart_point.pt')
    cfg = {**SWISS_ROLL.resolve(dict(SETTINGS, steps=FIRST)), 'seed': 0}
    heldout = experiment_data(SWISS_ROLL, cfg)[1]

    @torch.no_grad()
    def bits(path):
        d, rev = load_model(SWISS_ROLL, path)[:2]
        torch.manual_seed(1)                                # the same noise for every model
        return torch.cat([d.bound(rev, xb) for xb in heldout.split(500) for _ in range(8)]) / LN2

    before = bits(work / 'restart_point.pt').double()
    out = {}
    for way, extra, init in [('resumed', {}, None), ('plain', dict(warm_batches=0), 'restart'),
                             ('filled', {}, 'restart')]:
        out[way] = []
        for k in AFTER:
            folder = work / f'{way}_{k}'
            if init is None: shutil.copytree(work / 'first', folder)
            info = run(SWISS_ROLL, folder, dict(SETTINGS, steps=FIRST + k, **extra), progress=False,
                       init=None if init is None else work / 'restart_point.pt')[2]
            assert info['steps'] == FIRST + k
            drop = before - bits(folder / 'model.pt').double()
            out[way].append((drop.mean().item(), drop.std().item() / math.sqrt(len(drop))))
    return out


def noise(drops) -> float:
    "How far the bound of a resumed run moves in these steps: its largest |drop| plus 3 SE."
    return max(abs(m) + 3 * se for m, se in drops['resumed'])


def test_a_filled_restart_stays_within_the_noise(drops):
    worst = max(m - 3 * se for m, se in drops['filled'])
    assert worst < noise(drops), (drops['filled'], drops['resumed'])


def test_a_plain_restart_jumps(drops):
    "The check above can fail: the same restart without the filling drops the bound well past it."
    worst = max(m - 3 * se for m, se in drops['plain'])
    assert worst > 2 * noise(drops), (drops['plain'], drops['resumed'])


def test_the_record_says_how_the_restart_began(tmp_path):
    "The restart record names the batches that filled the optimiser (0: a plain restart)."
    small = dict(SETTINGS, steps=20)
    run(SWISS_ROLL, tmp_path / 'a', small, progress=False)
    for n in (0, 7):
        info = run(SWISS_ROLL, tmp_path / f'b{n}', dict(small, steps=25, warm_batches=n),
                   progress=False, init=tmp_path / 'a' / 'model.pt')[2]
        assert [(r['step'], r['warm_batches']) for r in info['restarts']] == [(20, n)]
