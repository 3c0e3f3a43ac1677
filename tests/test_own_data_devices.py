"""Your own data (chapter 15c) on each device: every verb with `--device`, then the model file read
back on the CPU. The CUDA case runs where a GPU is (bench/gpu_campaign.sh runs this file there);
the CPU case runs everywhere, so the test's own steps are checked in CI too."""
import csv, json, os
import numpy as np
import pytest
import torch
from PIL import Image

from hostile_helpers import moons, grey_folder, hole_mask

os.environ['DPM_SMALL'] = '1'
os.environ.setdefault('MPLBACKEND', 'Agg')
from dpm.cli import main                                           # noqa: E402
from dpm.own_data import DiffusionModel                            # noqa: E402

QUICK = ['--set', 'steps=20', '--set', 'T=5', '--no-progress']
DEVICES = ['cpu', pytest.param('cuda', marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs a CUDA device'))]


def finite_numbers(run) -> dict:
    "The numbers of `dpm evaluate`'s record in `run`, every one of them finite."
    n = json.loads((run / 'record.json').read_text())['numbers']
    assert all(np.isfinite(v) for v in n.values() if isinstance(v, float)), n
    return n


def verbs(kind: str, run, dev: str, posterior: list):
    "evaluate, sample, score (with --iw) and the posterior verbs, all on `dev`."
    main(['evaluate', kind, '--out', str(run), '--device', dev])
    main(['sample', kind, '--out', str(run), '-n', '6', '--device', dev])
    main(['score', str(run), '--iw', '3', '--device', dev])
    rows = list(csv.DictReader((run / 'scores.csv').open()))
    assert rows and all(np.isfinite(float(r['iw3_log_p_nats'])) for r in rows)
    for argv in posterior: main([*argv[:1], str(run), *argv[1:], '--device', dev])
    return finite_numbers(run)


@pytest.mark.parametrize('dev', DEVICES)
def test_points_on_the_device_and_back_on_the_cpu(tmp_path, dev):
    np.savetxt(tmp_path / 'pts.csv', moons(300), delimiter=',', header='a,b', comments='')
    run = tmp_path / 'run'
    main(['train', 'points', '--data', str(tmp_path / 'pts.csv'), '--out', str(run), *QUICK,
          '--device', dev])
    verbs('points', run, dev, [['inpaint', '--known', 'a=100.5', '-n', '3'],
                               ['denoise', '--point', '100,-5', '--sigma', '0.5', '-n', '2']])
    filled = np.array([[float(r['a']) for r in csv.DictReader((run / 'inpaint.csv').open())]])
    assert np.allclose(filled, 100.5, atol=1e-3)
    model = DiffusionModel.load(run / 'model.pt', 'cpu')                # trained on dev, read on cpu
    assert model.d.device == torch.device('cpu') and np.isfinite(model.score_samples(moons(5))).all()


@pytest.mark.parametrize('pathway', ['conv', 'dense'])
@pytest.mark.parametrize('dev', DEVICES)
def test_images_on_the_device_and_back_on_the_cpu(tmp_path, dev, pathway):
    grey_folder(tmp_path / 'imgs', 30, 8)
    run, image = tmp_path / 'run', str(tmp_path / 'imgs' / '003.png')
    main(['train', 'images', '--data', str(tmp_path / 'imgs'), '--out', str(run), *QUICK,
          '--set', f'pathway={pathway}', '--device', dev])
    mask = hole_mask(tmp_path / 'mask.png')
    n = verbs('images', run, dev, [['inpaint', '--image', image, '--mask', str(tmp_path / 'mask.png'),
                                    '-n', '2'],
                                   ['denoise', '--image', image, '--sigma', '0.1', '-n', '2']])
    assert 'nll_8bit_bits_per_dim' in n
    known = np.asarray(Image.open(image))
    assert (np.load(run / 'inpaint.npy')[:, 0][:, mask > 0] == known[mask > 0]).all()
    model = DiffusionModel.load(run / 'model.pt', 'cpu')
    assert np.isfinite(model.score_samples(np.asarray(Image.open(image))[None, None])).all()


@pytest.mark.parametrize('dev', DEVICES)
def test_bits_on_the_device_and_back_on_the_cpu(tmp_path, dev):
    x = np.zeros((60, 10), int)
    for i in range(60): x[i, i % 5::5] = 1
    np.savetxt(tmp_path / 'b.txt', x, fmt='%d')
    run = tmp_path / 'run'
    main(['train', 'bits', '--data', str(tmp_path / 'b.txt'), '--out', str(run), *QUICK,
          '--device', dev])
    assert verbs('bits', run, dev, [['inpaint', '--known', 'x1=1', '-n', '4']])['baseline'] == \
        'independent bits'
    rows = list(csv.DictReader((run / 'inpaint.csv').open()))
    assert all(r['x1'] == '1' for r in rows) and {v for r in rows for v in r.values()} <= {'0', '1'}
    assert np.isfinite(DiffusionModel.load(run / 'model.pt', 'cpu').score_samples(x[:4])).all()
