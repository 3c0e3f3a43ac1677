"""What the repository tracks (the sources of the book and the package, nothing built or cached), and
what a pip-installed package can do without the repository.

A stray file at the top level (a downloaded wheel, a scratch script) or a build output committed by
mistake (`_build/`, a virtual environment, `__pycache__/`, a scratch run in `runs/`) fails here, with
the offending paths named. The wheel built from the checkout carries the toy models (swiss roll,
heartbeat) that setup.py copies from results/models into dpm/assets/models; installed into a folder
of its own and run outside the checkout at full scale, `dpm sample` (with or without a model.pt in
its --out directory) and the chapters' `train_or_load` use them without training.
"""
import fnmatch
import json
import math
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

# The top-level names the repository may track.
ALLOWED_TOP = {
    'nbs', 'dpm', 'tests', 'tools', 'bench', 'results', '.ci', '.github',
    '_toc.yml', '_config.yml', '_static', 'settings.ini', 'setup.py', 'pyproject.toml',
    'MANIFEST.in', 'README.md', 'references.bib', '.gitignore', '.gitattributes', 'LICENSE',
}
# Built or cached things, anywhere in the tree (a path matches if any of its parts does).
NEVER_TRACKED = ['_build', '.venv', 'venv', '__pycache__', '.ipynb_checkpoints', '.pytest_cache',
                 'runs', '*.pyc', '*.pyo', '*.egg-info', '*.whl', 'dist', 'build', '.last_checked',
                 '_jupyter_execute', 'jupyter_execute']
# Built from the package at setup time (setup.py copies results/models there), never committed.
BUILT_PATHS = ['dpm/assets/models/*', '_static/mathjax/*']


def tracked():
    try:
        out = subprocess.run(['git', 'ls-files', '-z'], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f'not a git checkout ({e})')
    return [p for p in out.stdout.decode().split('\0') if p]


def offending(paths):
    """(top-level names outside the allow-list, paths of built or cached things)."""
    stray = sorted({p.split('/', 1)[0] for p in paths} - ALLOWED_TOP)
    built = sorted(p for p in paths
                   if any(fnmatch.fnmatch(part, pat) for part in p.split('/') for pat in NEVER_TRACKED)
                   or any(fnmatch.fnmatch(p, pat) for pat in BUILT_PATHS))
    return stray, built


def test_top_level_is_the_allow_list():
    stray, _ = offending(tracked())
    assert not stray, (f'tracked top-level names outside the allow-list: {stray}; remove them '
                       f'(git rm) or, if they belong to the project, add them to ALLOWED_TOP')


def test_nothing_built_or_cached_is_tracked():
    _, built = offending(tracked())
    assert not built, f'built or cached files are tracked (git rm --cached them): {built[:20]}'


def test_the_checks_catch_strays():
    """The two checks above on a made-up listing: they can fail."""
    paths = ['nbs/00_intro.ipynb', 'dpm/core.py', 'pyflakes-4.1.0-py2.py3-none-any.whl',
             '_build/html/index.html', 'dpm/__pycache__/core.cpython-311.pyc', 'runs/x/model.pt',
             'nbs/.ipynb_checkpoints/a.ipynb', 'README.md', 'dpm/assets/models/swiss_roll.pt']
    stray, built = offending(paths)
    assert stray == ['_build', 'pyflakes-4.1.0-py2.py3-none-any.whl', 'runs']
    assert built == ['_build/html/index.html', 'dpm/__pycache__/core.cpython-311.pyc',
                     'dpm/assets/models/swiss_roll.pt', 'nbs/.ipynb_checkpoints/a.ipynb',
                     'pyflakes-4.1.0-py2.py3-none-any.whl', 'runs/x/model.pt']


# ---- the installed package, without the repository ------------------------------------------------
MODELS = ROOT / 'results' / 'models'
TOY_MODELS = ['swiss_roll*.pt', 'heartbeat*.pt']
PACKED = TOY_MODELS + ['mnist.pt', 'digit_classifier.pt']   # what setup.py packs (PACKAGED_MODELS)
PACKS = ['mnist_gpu']                                      # and the packs of shards (PACKAGED_PACKS)
SHARDS = [p for name in PACKS for p in sorted((ROOT / 'results' / name / 'weights').glob(
    f'{name}.bf16.*.pt'))]
BUILD_FILES = ['setup.py', 'settings.ini', 'pyproject.toml', 'MANIFEST.in', 'README.md']


def confident_share(samples) -> str:
    """Python lines that set `share`: the fraction of the samples saved at `samples` (drawn by the
    model `d` the lines before them load) that the shipped digit classifier reads with confidence."""
    return ('import torch\n'
            'from dpm.digit_classifier import load_classifier, classifier_path, digit_outputs\n'
            'from dpm.data import model_scaler\n'
            'net = load_classifier(train_if_missing=False)\n'
            f'x = torch.load({str(samples)!r})\n'
            'u = model_scaler(d).inverse(x.double()).clamp(0, 1)\n'
            'share = (digit_outputs(net, u)[1].max(1).values > 0.9).double().mean().item()\n')


def run_python(code: str, cwd, env, timeout: float = 300):
    "Run `code` in the installed package's Python, outside the checkout."
    return subprocess.run([sys.executable, '-c', code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
    """The wheel built from this checkout (`pip wheel --no-deps`), installed into a folder of its own;
    (wheel, site folder, environment that imports dpm from there and nothing from the checkout)."""
    tmp = tmp_path_factory.mktemp('wheel')
    src = tmp / 'src'
    for rel in tracked():
        path = Path(rel)
        if rel in BUILD_FILES or path.parts[0] == 'dpm' or ROOT / path in SHARDS or (
                path.parent.as_posix() == 'results/models'
                and any(fnmatch.fnmatch(path.name, pat) for pat in PACKED)):
            (src / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, src / path)
    pip = [sys.executable, '-m', 'pip', '-q', '--disable-pip-version-check']
    run = lambda cmd: subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    r = run([*pip, 'wheel', '--no-deps', '--no-build-isolation', '-w', str(tmp / 'dist'), str(src)])
    assert r.returncode == 0, f'pip wheel failed:\n{r.stdout}\n{r.stderr}'
    wheel, = (tmp / 'dist').glob('dpm-*.whl')
    site = tmp / 'site'
    r = run([*pip, 'install', '--no-deps', '--target', str(site), str(wheel)])
    assert r.returncode == 0, f'pip install --target failed:\n{r.stdout}\n{r.stderr}'
    env = {k: v for k, v in os.environ.items()
           if k not in ('DPM_SMALL', 'DPM_ROOT', 'PYTHONPATH', 'PYTHONHOME')}
    env.update(PYTHONPATH=str(site), PYTHONNOUSERSITE='1', MPLBACKEND='Agg', OMP_NUM_THREADS='1')
    return wheel, site, env


def test_wheel_carries_the_packaged_models(installed):
    wheel, site, env = installed
    with zipfile.ZipFile(wheel) as z:
        packed = {Path(i.filename).name: i.file_size for i in z.infolist()
                  if i.filename.startswith('dpm/assets/models/')}
    want = {p.name for pat in PACKED for p in MODELS.glob(pat)} | {p.name for p in SHARDS}
    assert want and set(packed) == want, (sorted(packed), sorted(want))
    assert {'swiss_roll.pt', 'heartbeat.pt', 'mnist.pt', 'digit_classifier.pt',
            'mnist_gpu.bf16.00.pt'} <= want
    toys = sum(v for k, v in packed.items() if any(fnmatch.fnmatch(k, p) for p in TOY_MODELS))
    assert toys < 4e6, f'{toys / 1e6:.1f} MB of toy models in the wheel'
    book = sum(v for k, v in packed.items() if k not in {p.name for p in SHARDS})
    assert book < 14e6, f'{book / 1e6:.1f} MB of book-scale models in the wheel'
    paper = sum(v for k, v in packed.items() if k in {p.name for p in SHARDS})
    assert paper < 24e6, f'{paper / 1e6:.1f} MB of paper-scale packs in the wheel'


def test_installed_cli_samples_the_shipped_models(installed, tmp_path):
    """`dpm sample` from the installed wheel, outside the checkout, at full scale: the toy models the
    wheel carries are loaded, nothing is trained; a DIR without model.pt (heartbeat here) falls back
    to the shipped model and says so on stdout (a notice: no `dpm:` line), a DIR with one (swiss
    roll) uses its own silently."""
    wheel, site, env = installed
    dpm_cli = site / 'bin' / 'dpm'
    where = subprocess.run([sys.executable, '-c', 'import dpm, dpm.data; print(dpm.__file__); '
                            'print(dpm.data.assets_dir())'], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    module, assets = where.stdout.split()
    assert Path(module).is_relative_to(site), f'dpm imported from {module}, not from the wheel'
    for exp, n, own in [('swiss_roll', 500, True), ('heartbeat', 50, False)]:
        out = tmp_path / exp                       # heartbeat: created by `dpm sample` itself
        if own:
            out.mkdir()
            shutil.copy(Path(assets) / 'models' / f'{exp}.pt', out / 'model.pt')
        r = subprocess.run([str(dpm_cli), 'sample', exp, '--out', str(out), '-n', str(n),
                            '--device', 'cpu'], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, f'dpm sample {exp}:\n{r.stdout}\n{r.stderr}'
        assert f'{n} samples' in r.stdout, r.stdout
        said = f'{out / "model.pt"} not found; using the model shipped with dpm'
        assert (said in r.stdout) != own and 'dpm:' not in r.stderr, r.stdout + r.stderr   # a notice
        assert (out / 'samples.pt').stat().st_size > 0 and (out / 'samples.png').stat().st_size > 0
        assert not (out / 'checkpoint.pt').exists() and not (out / 'training.json').exists()
        assert (out / 'model.pt').exists() == own                  # the shipped model is not copied


def test_installed_cli_samples_digits(installed, tmp_path):
    """`dpm sample mnist` from the installed wheel draws from the shipped MNIST model, and the shipped
    digit classifier loads (checked, never retrained) and reads most of the samples as digits."""
    wheel, site, env = installed
    out = tmp_path / 'mnist'
    r = subprocess.run([str(site / 'bin' / 'dpm'), 'sample', 'mnist', '--out', str(out), '-n', '64',
                        '--device', 'cpu'], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f'dpm sample mnist:\n{r.stdout}\n{r.stderr}'
    assert 'using the model shipped with dpm' in r.stdout, r.stdout
    code = ('from dpm.mnist import MNIST\n'
            'import dpm.training as t\n'
            'd, rev, info, cfg = t.load_model(MNIST, t.packaged_model("mnist"))\n'
            + confident_share(out / 'samples.pt') + 'print(classifier_path(), share)\n')
    r = run_python(code, tmp_path, env)
    assert r.returncode == 0, r.stdout + r.stderr
    where, share = r.stdout.split()
    assert Path(where).is_relative_to(site), where
    assert float(share) > 0.3, f'only {share} of 64 samples read as digits with confidence'


def test_installed_cli_samples_paper_scale_digits(installed, tmp_path):
    """`dpm sample mnist_gpu` from the installed wheel draws from the paper-scale model of the GPU
    campaign (its pack of bf16 shards, read on the CPU), and most samples read as digits."""
    wheel, site, env = installed
    out = tmp_path / 'mnist_gpu'
    r = subprocess.run([str(site / 'bin' / 'dpm'), 'sample', 'mnist_gpu', '--out', str(out), '-n',
                        '16', '--device', 'cpu'], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, f'dpm sample mnist_gpu:\n{r.stdout}\n{r.stderr}'
    assert 'using the model shipped with dpm' in r.stdout and 'mnist_gpu.bf16.00.pt' in r.stdout
    code = ('from dpm.experiments import load_model, packaged_model\n'
            'from dpm.cli import get_experiment\n'
            'path = packaged_model("mnist_gpu")\n'
            'd, rev, info, cfg = load_model(get_experiment("mnist_gpu"), path)\n'
            + confident_share(out / 'samples.pt') + 'print(path, info["steps"], share)\n')
    r = run_python(code, tmp_path, env)
    assert r.returncode == 0, r.stdout + r.stderr
    where, steps, share = r.stdout.split()
    assert Path(where).is_relative_to(site), where
    record = json.loads((ROOT / 'results' / 'mnist_gpu' / 'training.json').read_text())
    assert int(steps) == record['steps']                        # the committed campaign's model
    assert float(share) > 0.3, f'only {share} of 16 samples read as digits with confidence'


def test_installed_cli_evaluates_the_shipped_heartbeat(installed, tmp_path):
    """`dpm evaluate heartbeat` from the installed wheel, outside the checkout, at full scale: the
    shipped model is evaluated (about 45 s on one thread), nothing is trained, the record is written."""
    wheel, site, env = installed
    out = tmp_path / 'hb'
    r = subprocess.run([str(site / 'bin' / 'dpm'), 'evaluate', 'heartbeat', '--out', str(out),
                        '--device', 'cpu'], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f'dpm evaluate heartbeat:\n{r.stdout}\n{r.stderr}'
    assert 'using the model shipped with dpm' in r.stdout, r.stdout
    record = json.loads((out / 'record.json').read_text())
    assert record['experiment'] == 'heartbeat' and math.isfinite(record['numbers']['K_bits'])
    assert all((out / f).stat().st_size > 0 for f in record['figures'])
    assert not (out / 'model.pt').exists() and not (out / 'checkpoint.pt').exists()


def own_data_files(folder: Path):
    "What README's own-data lines name: pts.csv, my_images/ (8 x 8 grey), x.png, y.png, m.png."
    import numpy as np
    from hostile_helpers import moons, grey_folder, hole_mask
    np.savetxt(folder / 'pts.csv', moons(300), delimiter=',', header='x1,x2', comments='')
    grey_folder(folder / 'my_images', 30, 8)
    for name in ('x.png', 'y.png'): shutil.copy(folder / 'my_images' / '000.png', folder / name)
    hole_mask(folder / 'm.png')


def test_installed_runs_the_own_data_commands_and_example(installed, tmp_path):
    """README's own-data lines, as written (small configuration, 20 steps of T = 5 for training), and
    nbs/using_dpm.md's Python example, from the installed wheel outside the checkout: exit 0, no
    `dpm:` line, and what each verb writes."""
    import re, shlex
    wheel, site, env = installed
    env = {**env, 'DPM_SMALL': '1'}
    own_data_files(tmp_path)
    block = (ROOT / 'README.md').read_text().split('Your own data:', 1)[1]
    lines = [l.split('#', 1)[0].strip() for l in block.split('```bash\n', 1)[1].split('```', 1)[0]
             .splitlines()]
    lines = [l for l in lines if l.startswith('dpm ')]
    verbs = [shlex.split(l)[1] for l in lines]
    assert {'train', 'evaluate', 'sample', 'score', 'inpaint', 'denoise'} <= set(verbs), lines
    for line in lines:
        args = shlex.split(line)[1:]
        if args[0] == 'train': args += ['--set', 'steps=20', '--set', 'T=5', '--no-progress']
        r = subprocess.run([str(site / 'bin' / 'dpm'), *args], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and 'dpm:' not in r.stderr, (line, r.stdout[-800:], r.stderr[-1500:])
    runs = tmp_path / 'runs'
    for f in ('pts/record.json', 'pts/scores.csv', 'pts/samples.pt', 'img/record.json',
              'img/inpaint.png', 'img/denoise.png'):
        assert (runs / f).stat().st_size > 0, f
    section = (ROOT / 'nbs' / 'using_dpm.md').read_text().split('## Your own data', 1)[1]
    r = run_python('import torch; torch.set_num_threads(1)\n'
                   + section.split('```python\n', 1)[1].split('```', 1)[0], tmp_path, env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / 'ring.pt').exists()


def test_installed_train_or_load_reuses_the_shipped_model(installed, tmp_path):
    """The chapters' train_or_load in an installed package: the full-scale swiss roll is loaded from
    the package, not trained (training is replaced by an error here)."""
    wheel, site, env = installed
    code = ('import dpm.training as t\n'
            'from dpm.cli import get_experiment\n'
            'def no_training(*a, **k): raise SystemExit("train_or_load trained instead of loading")\n'
            't.run = no_training\n'
            'd, reverse, info, cfg = t.train_or_load(get_experiment("swiss_roll"), progress=False)\n'
            'print("loaded", info["steps"])\n')
    r = run_python(code, tmp_path, env)
    assert r.returncode == 0 and 'loaded' in r.stdout, r.stdout + r.stderr
