"""Your own data (chapter 15c): the readers, the split and its record, the three experiments through
`dpm train --data` and the verbs evaluate, sample, score, inpaint and denoise (bits end to end, and
every kind with --device, in test_own_data_devices.py), the Python interface,
and bad data: one `dpm:` line, a non-zero exit and an unchanged run directory for each kind."""
import csv, json, os
from pathlib import Path
import numpy as np
import pytest
import torch
from PIL import Image

from hostile_helpers import (exits, huge_header_jpeg, dpm as dpm_process, one_line, moons, grey_folder,
                             hole_mask)

os.environ['DPM_SMALL'] = '1'
os.environ.setdefault('MPLBACKEND', 'Agg')
from dpm.cli import main                                           # noqa: E402
from dpm import own_data                                           # noqa: E402
from dpm.own_data import (read_table, read_images, split_indices, DiffusionModel, examples,
                          data_facts, EXPERIMENTS)                 # noqa: E402
from dpm.settings import DataError                                 # noqa: E402

QUICK = ['--set', 'steps=20', '--set', 'T=5', '--no-progress']


def snapshot(folder: Path) -> dict:
    "Names, sizes and modification times of everything under `folder` (absent: {})."
    if not folder.exists(): return {}
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob('*')}


def refused(argv, out: Path, *words):
    "`dpm argv` exits with one `dpm:` line naming `words` and leaves `out` as it was."
    before = snapshot(out)
    msg = exits(lambda: main(argv), *words)
    assert snapshot(out) == before, f"{out} changed"
    return msg


# --- tables ---

def test_tables_read_every_format_with_header_detection(tmp_path):
    x = moons(10)
    np.savetxt(tmp_path / 'h.csv', x, delimiter=',', header='a,b', comments='')
    np.savetxt(tmp_path / 'n.tsv', x, delimiter='\t')
    np.savetxt(tmp_path / 's.txt', x)
    np.save(tmp_path / 'a.npy', x); np.savez(tmp_path / 'z.npz', only=x)
    for name, names in (('h.csv', ['a', 'b']), ('n.tsv', ['x1', 'x2']), ('s.txt', ['x1', 'x2']),
                        ('a.npy', ['x1', 'x2']), ('z.npz', ['x1', 'x2'])):
        t = read_table(tmp_path / name)
        assert t.names == names and np.allclose(t.values, x, atol=1e-6), name


@pytest.mark.parametrize('text, words', [
    ("a,b\n1,2\n3\n", ['line 3', 'ragged']),
    ("a,b\n1,2\n3,x\n", ['line 3, column 2', 'not a number']),
    ("a,b\n1,2\n3,nan\n", ['finite']),
    ("a,b\n1,2\ninf,3\n", ['finite']),
    ("a,b\n", ['no rows']),
])
def test_bad_tables_are_named(tmp_path, text, words):
    (tmp_path / 't.csv').write_text(text)
    with pytest.raises(DataError) as e: read_table(tmp_path / 't.csv')
    for w in words: assert w in str(e.value)


def test_arrays_without_columns_or_with_two_arrays_are_refused(tmp_path):
    np.save(tmp_path / 'empty.npy', np.zeros((5, 0)))
    np.savez(tmp_path / 'two.npz', a=np.zeros(3), b=np.ones(3))
    with pytest.raises(DataError, match='no columns'): read_table(tmp_path / 'empty.npy')
    with pytest.raises(DataError, match='2 arrays'): read_table(tmp_path / 'two.npz')


def test_split_is_fixed_by_its_seed_and_needs_enough_examples():
    a, b = split_indices(100, 0.1, 3), split_indices(100, 0.1, 3)
    assert torch.equal(a[0], b[0]) and len(a[1]) == 10 and not set(a[0].tolist()) & set(a[1].tolist())
    assert not torch.equal(split_indices(100, 0.1, 4)[1], a[1])
    with pytest.raises(DataError, match='too few'): split_indices(3, 0.1, 0)


# --- images ---

def test_image_modes_decide_channels_and_keep_levels(tmp_path):
    grey = tmp_path / 'grey'; grey.mkdir()
    level = np.arange(64, dtype=np.uint8).reshape(8, 8) * 4
    Image.fromarray(level, 'L').save(grey / 'l.png')
    Image.fromarray(level, 'L').convert('LA').save(grey / 'la.png')
    Image.fromarray(level.astype(np.uint16) * 257).save(grey / 'i16.png')       # 16-bit grey
    Image.fromarray(level, 'L').convert('P').save(grey / 'p.png')               # a grey palette
    got = read_images(grey)
    assert got.images.shape == (4, 1, 8, 8) and got.colour == 0 and got.alpha == 1
    assert all(np.abs(got.images[i, 0].astype(int) - level).max() <= 1 for i in range(4))
    Image.fromarray(np.zeros((8, 8, 4), np.uint8), 'RGBA').save(grey / 'rgba.png')
    got = read_images(grey)
    assert got.images.shape == (5, 3, 8, 8) and got.colour == 1 and got.alpha == 2


def test_exif_orientation_is_applied(tmp_path):
    a = np.zeros((8, 16), np.uint8); a[:, :8] = 255                             # left half white
    im = Image.fromarray(a, 'L'); exif = im.getexif(); exif[0x0112] = 6          # rotate 90 deg
    (tmp_path / 'f').mkdir(); im.save(tmp_path / 'f' / 'r.jpg', exif=exif, quality=100)
    Image.fromarray(a, 'L').save(tmp_path / 'f' / 'plain.png')
    got = read_images(tmp_path / 'f', size=8)
    plain, rotated = got.images[[got.files.index(str(tmp_path / 'f' / n)) for n in ('plain.png', 'r.jpg')], 0]
    assert plain[:, 0].mean() > 200                                            # white on the left
    assert rotated[0].mean() > 200 and rotated[-1].mean() < 50                 # white on top


def test_size_rule_and_memory_cap(tmp_path, monkeypatch):
    f = grey_folder(tmp_path / 'f', 3, 20)
    assert read_images(f).images.shape[-1] == 16                               # 20 -> multiple of 8
    monkeypatch.setattr(own_data, 'IMAGES_MAX_BYTES', 100)
    with pytest.raises(DataError, match='MiB'): read_images(f)


# --- the command line, end to end ---

@pytest.fixture(scope='module')
def points_run(tmp_path_factory):
    root = tmp_path_factory.mktemp('points')
    np.savetxt(root / 'pts.csv', moons(), delimiter=',', header='a,b', comments='')
    main(['train', 'points', '--data', str(root / 'pts.csv'), '--out', str(root / 'run'), *QUICK])
    return root


def test_points_train_evaluate_sample_score(points_run, capsys):
    run = points_run / 'run'
    ck = torch.load(run / 'model.pt', weights_only=False)
    assert ck['config']['data'] == str(points_run / 'pts.csv') and ck['config']['names'] == ['a', 'b']
    assert {r['split'] for r in ck['info']['data'] if 'split' in r} == {'train', 'heldout'}
    assert all(len(r['files_sha256']) == 64 for r in ck['info']['data'] if 'split' in r)
    main(['evaluate', 'points', '--out', str(run)])
    n = json.loads((run / 'record.json').read_text())['numbers']
    assert n['baseline'] == 'full-covariance Gaussian' and n['K_bits_per_dim_se'] > 0
    assert 'samples.png' in json.loads((run / 'record.json').read_text())['figures']
    main(['sample', 'points', '--out', str(run), '-n', '500'])
    s = torch.load(run / 'samples.pt')
    assert s.shape == (500, 2) and abs(s[:, 0].mean() - 100) < 10                # the table's units
    main(['score', str(run), '--iw', '3'])
    rows = list(csv.DictReader((run / 'scores.csv').open()))
    assert len(rows) == 400 and {r['split'] for r in rows} == {'train', 'heldout'}
    assert all(np.isfinite(float(r['K_nats'])) and np.isfinite(float(r['iw3_log_p_nats'])) for r in rows)
    assert all(float(r['iw3_se_nats']) >= 0 for r in rows)


def test_evaluation_keeps_no_graph(points_run, monkeypatch):
    """The importance-weighted log p of `dpm evaluate` runs without autograd: a graph of its T steps
    kept 18.9 GB for 50 digits of 8 x 8 at full scale (680 MB without)."""
    from dpm.diffusion import Diffusion
    seen, plain = [], Diffusion.log_likelihood
    monkeypatch.setattr(Diffusion, 'log_likelihood',
                        lambda *a, **k: seen.append(torch.is_grad_enabled()) or plain(*a, **k))
    model = DiffusionModel.load(points_run / 'run')
    model.cfg['iw_samples'] = 2
    model.evaluate()
    assert seen and not any(seen), seen


def test_points_inpaint_and_denoise(points_run):
    run = points_run / 'run'
    main(['inpaint', str(run), '--known', 'a=100.5', '-n', '6'])
    rows = list(csv.DictReader((run / 'inpaint.csv').open()))
    assert len(rows) == 6 and all(abs(float(r['a']) - 100.5) < 1e-3 for r in rows)
    main(['denoise', str(run), '--point', '100,-5', '--sigma', '0.5', '-n', '4'])
    assert len(list(csv.DictReader((run / 'denoise.csv').open()))) == 4


def test_the_same_command_resumes(points_run, capsys):
    main(['train', 'points', '--data', str(points_run / 'pts.csv'), '--out', str(points_run / 'run'),
          *QUICK])
    assert 'trained points' in capsys.readouterr().out


@pytest.fixture(scope='module')
def images_run(tmp_path_factory):
    root = tmp_path_factory.mktemp('images')
    grey_folder(root / 'imgs', 30, 8)
    main(['train', 'images', '--data', str(root / 'imgs'), '--out', str(root / 'run'), *QUICK])
    return root


def test_images_evaluate_score_inpaint_denoise(images_run):
    run, imgs = images_run / 'run', images_run / 'imgs'
    main(['evaluate', 'images', '--out', str(run)])
    assert 'nll_8bit_bits_per_dim' in json.loads((run / 'record.json').read_text())['numbers']
    main(['score', str(run), str(imgs / '000.png'), str(imgs / '001.png')])
    assert len((run / 'scores.csv').read_text().splitlines()) == 3
    mask = hole_mask(images_run / 'mask.png')
    main(['inpaint', str(run), '--image', str(imgs / '003.png'), '--mask', str(images_run / 'mask.png'),
          '-n', '3'])
    filled = np.load(run / 'inpaint.npy')
    known = np.asarray(Image.open(imgs / '003.png'))
    assert filled.shape == (3, 1, 8, 8) and (filled[:, 0][:, mask > 0] == known[mask > 0]).all()
    main(['denoise', str(run), '--image', str(imgs / '003.png'), '--sigma', '0.1', '-n', '2'])
    assert np.load(run / 'denoise.npy').shape == (2, 1, 8, 8) and (run / 'denoise.png').stat().st_size


def test_images_refused_at_score_and_inpaint_time(images_run, tmp_path):
    run = images_run / 'run'
    Image.fromarray(np.zeros((8, 8, 3), np.uint8), 'RGB').save(tmp_path / 'rgb.png')
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / 'tiny.png')
    Image.fromarray(np.zeros((9, 9), np.uint8)).save(tmp_path / 'mask9.png')
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / 'black.png')
    refused(['score', str(run), str(tmp_path / 'rgb.png')], run, 'colour', 'grey')
    refused(['score', str(run), str(tmp_path / 'tiny.png')], run, 'smaller')
    img = str(images_run / 'imgs' / '000.png')
    refused(['inpaint', str(run), '--image', img, '--mask', str(tmp_path / 'mask9.png')], run, '9 x 9')
    refused(['inpaint', str(run), '--image', img, '--mask', str(tmp_path / 'black.png')], run, 'no entry')
    refused(['inpaint', str(run), '--image', img], run, '--mask')


# --- bad data: one line, non-zero exit, the run directory unchanged ---

def test_bad_data_is_one_line_and_changes_nothing(tmp_path, monkeypatch):
    out = tmp_path / 'run'
    out.mkdir(); (out / 'keep.txt').write_text('mine')
    train = lambda kind, data, *more: ['train', kind, '--data', str(data), '--out', str(out), *QUICK, *more]
    (tmp_path / 'empty').mkdir()
    refused(train('images', tmp_path / 'empty'), out, 'holds no images')
    (tmp_path / 'noimg').mkdir(); (tmp_path / 'noimg' / 'a.txt').write_text('x')
    refused(train('images', tmp_path / 'noimg'), out, 'holds no images', '1 other')
    bad = grey_folder(tmp_path / 'bad', 6)
    (bad / 'fake.png').write_text('not a picture')
    refused(train('images', bad), out, 'fake.png', 'not an image')
    png = (tmp_path / 'bad' / '000.png').read_bytes()
    trunc = grey_folder(tmp_path / 'trunc', 6); (trunc / 'cut.png').write_bytes(png[:len(png) // 2])
    refused(train('images', trunc), out, 'cut.png')
    bomb = grey_folder(tmp_path / 'bomb', 6); huge_header_jpeg(bomb / 'huge.jpg')
    refused(train('images', bomb), out, 'huge.jpg', 'decompression bomb')
    refused(train('images', grey_folder(tmp_path / 'one', 1)), out, 'too few')
    refused(train('images', tmp_path / 'bad' / '000.png'), out, 'is a file')
    loop = grey_folder(tmp_path / 'loop', 6); os.symlink('self.png', loop / 'self.png')
    refused(train('images', loop), out, 'self.png')
    tables = {'one.csv': "a,b\n1,2\n", 'ragged.csv': "a,b\n1,2\n3\n", 'word.csv': "a,b\n1,2\n3,x\n",
              'nan.csv': "a,b\n1,2\n3,nan\n", 'const.csv': "a,b\n" + "1,2\n1,3\n1,4\n1,5\n1,6\n"}
    words = {'one.csv': 'too few', 'ragged.csv': 'ragged', 'word.csv': 'not a number',
             'nan.csv': 'finite', 'const.csv': 'constant'}
    for name, text in tables.items():
        (tmp_path / name).write_text(text)
        refused(train('points', tmp_path / name), out, name, words[name])
    np.save(tmp_path / 'd0.npy', np.zeros((5, 0)))
    refused(train('points', tmp_path / 'd0.npy'), out, 'no columns')
    refused(train('points', tmp_path / 'bad'), out, 'is a folder')
    (tmp_path / 'half.txt').write_text("0 1\n1 0\n0.5 1\n1 1\n0 0\n")
    refused(train('bits', tmp_path / 'half.txt'), out, 'must be 0 or 1')
    refused(['train', 'points', '--out', str(out), *QUICK], out, '--data')
    assert (out / 'keep.txt').read_text() == 'mine'


def test_symlinked_folder_loops_are_not_followed(tmp_path):
    f = grey_folder(tmp_path / 'f', 5)
    os.symlink('.', f / 'again')                                          # f/again -> f
    assert len(read_images(f).files) == 5


def test_skip_bad_skips_with_a_count(tmp_path, capsys):
    bad = grey_folder(tmp_path / 'bad', 8); (bad / 'fake.png').write_text('no')
    main(['train', 'images', '--data', str(bad), '--out', str(tmp_path / 'run'), *QUICK,
          '--set', 'skip_bad=true', '--set', 'steps=2'])
    assert '1 bad image(s) skipped' in capsys.readouterr().out


# --- Python ---

def test_python_interface(tmp_path):
    x = moons(300)
    m = DiffusionModel('points', out=tmp_path / 'run', steps=20, T=5).fit(x)
    s = m.score_samples(x[:50])
    assert s.shape == (50,) and np.isfinite(s).all() and m.score(x[:50]) == pytest.approx(s.mean())
    assert m.score_samples(x[:5], iw=4).shape == (5,)
    ll, se = m.score_samples(x[:5], iw=4, return_se=True)
    assert ll.shape == se.shape == (5,) and (se >= 0).all()
    assert m.sample(7).shape == (7, 2)
    filled = m.inpaint(np.array([100.0, 0.0]), [True, False], n=3)
    assert filled.shape == (3, 2) and np.allclose(filled[:, 0], 100.0)
    assert m.denoise(np.array([100.0, -5.0]), 0.5, n=2).shape == (2, 2)
    m.save(tmp_path / 'copy.pt')
    again = DiffusionModel.load(tmp_path / 'copy.pt')
    assert np.allclose(again.score_samples(x[:20]), m.score_samples(x[:20]))
    with pytest.raises(DataError, match='shape'): m.score_samples(np.zeros((3, 5)))


def test_scores_are_in_the_users_units(tmp_path):
    "eq-own-units: scaling a column by c moves every log-likelihood by -log c, the model unchanged."
    x = moons(200)
    m = DiffusionModel('points', out=tmp_path / 'a', steps=5, T=5).fit(x)
    y = x * [10.0, 1.0]
    m2 = DiffusionModel('points', out=tmp_path / 'b', steps=5, T=5).fit(y)
    assert np.allclose(m2.score_samples(y[:30]) - m.score_samples(x[:30]), -np.log(10), atol=1e-4)


def test_help_and_list_name_the_new_commands():
    r = dpm_process('--help')
    assert all(w in r.stdout for w in ('score', 'inpaint', 'denoise'))
    r = dpm_process('list')
    assert all(w in r.stdout for w in ('images', 'points', 'bits'))


def test_a_bad_table_in_a_fresh_process_is_one_line(tmp_path):
    (tmp_path / 'r.csv').write_text("a,b\n1,2\n3\n")
    one_line(dpm_process('train', 'points', '--data', str(tmp_path / 'r.csv'), '--out', str(tmp_path / 'o')),
             'ragged')
    assert not (tmp_path / 'o').exists()


def test_the_iw_standard_error_matches_repeated_estimates(tmp_path):
    "eq-iw-se: the delta-method se of log p-hat is close to the spread of independent estimates."
    m = DiffusionModel('points', out=tmp_path / 'run', steps=20, T=5).fit(moons(200))
    z = own_data.to_model_units('points', m.cfg, moons(3, seed=1))
    torch.manual_seed(0)
    iw = lambda: m.d.log_likelihood(m.reverse, z, 200, return_se=True)
    reps = torch.stack([iw()[0] for _ in range(40)])
    se = iw()[1]
    ratio = (reps.std(0) / se).numpy()
    assert ((ratio > 0.5) & (ratio < 2)).all(), ratio


def test_fit_or_load_reads_its_record_while_the_key_matches(tmp_path, monkeypatch):
    "The chapter's records: read back while data, settings and seed match; trained again if not."
    x = moons(200)
    np.savetxt(tmp_path / 'a.csv', x, delimiter=',', header='u,v', comments='')
    record = tmp_path / 'models' / 'a.pt'; record.parent.mkdir()
    fit = lambda where, **s: own_data.fit_or_load(DiffusionModel('points', out=tmp_path / where,
                                                                 steps=5, T=5, **s),
                                                  tmp_path / 'a.csv', record)
    first = fit('one')
    assert record.exists() and first.path == tmp_path / 'one' / 'model.pt'
    again = fit('two')
    assert again.path == record and not (tmp_path / 'two' / 'model.pt').exists()
    assert again.cfg['data'] == str((tmp_path / 'a.csv').resolve())      # its data where they are now
    assert np.allclose(again.score_samples(x[:20]), first.score_samples(x[:20]))
    other = fit('three', heldout=0.2)                                  # other settings: trained
    assert other.path == tmp_path / 'three' / 'model.pt'
    np.savetxt(tmp_path / 'a.csv', x + 1, delimiter=',', header='u,v', comments='')
    assert fit('four').path == tmp_path / 'four' / 'model.pt'         # other data: trained
    monkeypatch.setenv('DPM_SMALL', '0'); monkeypatch.setenv('DPM_ROOT', str(tmp_path))
    (tmp_path / 'results' / 'evaluations').mkdir(parents=True)
    study = lambda m, n: {'mean': float(m.score_samples(m.heldout()[:n]).mean())}
    made, where = own_data.recorded(again, 's', study, n=10)
    read, where_read = own_data.recorded(again, 's', study, n=10)
    assert not where['read'] and where_read['read'] and read == made
    assert not own_data.recorded(again, 's', study, n=11)[1]['read']   # other settings: computed


# --- texture crops ---

def stripe_folder(root: Path, n=2, h=100, w=48) -> Path:
    "Grey images whose pixel value is its row: a crop's values tell where it was cut."
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(np.arange(h, dtype=np.uint8)[:, None].repeat(w, 1), 'L').save(root / f'{i}.png')
    return root


def test_texture_crops_split_by_band_never_overlap(tmp_path):
    folder = stripe_folder(tmp_path / 'tex')
    got = read_images(folder, size=16, crops=30, heldout=0.1, seed=3)
    assert got.images.shape == (2 * (30 + own_data.held_crops(30, 0.1)), 1, 16, 16)
    cfg = dict(heldout=0.1, split_seed=3)
    train, held = own_data.data_split(cfg, got)
    assert len(held) == 2 * own_data.held_crops(30, 0.1) and len(train) == 60
    assert got.images[train.numpy()].max() < 100 - 16 <= got.images[held.numpy()].min()
    assert sorted(set(got.origin[held.numpy()])) == [0, 1]            # each image gives to both
    again = read_images(folder, size=16, crops=30, heldout=0.1, seed=3)
    assert np.array_equal(got.images, again.images)                   # fixed by the seed
    assert not np.array_equal(got.images, read_images(folder, size=16, crops=30, seed=4).images)
    assert got.names()[0].endswith('0.png crop 1')


def test_texture_crops_through_the_cli(tmp_path, capsys):
    folder, out = stripe_folder(tmp_path / 'tex', n=2, h=120, w=64), tmp_path / 'run'
    main(['train', 'images', '--data', str(folder), '--small', '--set', 'crops=12', '--set',
          'size=16', '--out', str(out), *QUICK])
    line = [l for l in capsys.readouterr().out.splitlines() if 'choices' in l][0]
    assert '12 random crops of 16 x 16' in line and '4 held out' in line, line
    main(['score', str(out), str(folder / '0.png'), '--csv', str(tmp_path / 's.csv')])
    model = DiffusionModel.load(out)
    x, _ = own_data.model_images([folder / '0.png'], model.cfg)       # the centre crop, not resized
    assert x.shape == (1, 1, 16, 16) and x.min() == (120 - 16) // 2 and x.max() == (120 + 16) // 2 - 1
    refused(['train', 'images', '--data', str(folder), '--small', '--set', 'crops=12', '--set',
             'size=64', '--out', str(tmp_path / 'run2'), *QUICK], tmp_path / 'run2', 'crops of 64 x 64')


def test_the_dense_pathway_of_chapter_13(tmp_path, capsys):
    "pathway=dense builds MNIST's network (eq-net-dense) on a folder; a pathway it lacks is refused."
    folder, out = grey_folder(tmp_path / 'imgs', 30, 8), tmp_path / 'run'
    main(['train', 'images', '--data', str(folder), '--out', str(out), '--set', 'pathway=dense',
          '--set', 'dense_hidden=16', '--set', 'pixel_input=true', *QUICK])
    assert 'dense pathway 4 x 16' in capsys.readouterr().out
    model = DiffusionModel.load(out)
    assert model.reverse.pathway == 'dense' and model.score_samples(folder).shape == (30,)
    refused(['train', 'images', '--data', str(folder), '--out', str(tmp_path / 'run2'), '--set',
             'pathway=dens', *QUICK], tmp_path / 'run2', "'conv', 'dense', 'both'")


@pytest.mark.skipif(not torch.distributed.is_available(), reason='torch.distributed missing')
def test_own_points_train_on_two_processes(tmp_path):
    """`torchrun -m dpm train points --data`: the same data split and choices on each rank, one
    model written, which `dpm evaluate` then reads."""
    import subprocess, sys
    from hostile_helpers import ENV, ROOT
    data, out = tmp_path / 'pts.csv', tmp_path / 'run'
    np.savetxt(data, moons(300), delimiter=',', header='a,b', comments='')
    r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                        '--nproc_per_node=2', '-m', 'dpm', 'train', 'points', '--data', str(data),
                        '--out', str(out), *QUICK], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert '2 process(es)' in r.stdout and (out / 'model.pt').exists(), r.stdout[-1000:]
    assert r.stdout.count('data: choices:') == 1, r.stdout                # rank 0 speaks
    main(['evaluate', 'points', '--out', str(out)])
    assert (out / 'record.json').exists()
