"""Same pipeline: MNIST written out as 70,000 PNG files and trained with `dpm train images --data`
against `dpm train mnist`, at equal steps, with the book MNIST model's network and settings.

1. Writes MNIST's 70,000 digits as 8-bit grey PNG files (file i < 60,000 is training digit i, file
   60,000 + j is test digit j): the 50,000 that `dpm train mnist` trains on (train[:50000]) into
   WORK/png/train, the other 20,000 (its validation and test digits) into WORK/png/rest.
2. Reads both folders back with the reader of chapter 15c and stops unless every digit's 784
   levels are MNIST's.
3. Trains SEEDS seeds of each with the `dpm` command, two processes at a time, one thread each,
   full scale: `dpm train mnist --seed S` and `dpm train images --data WORK/png/train --seed S` with
   every network, schedule and training setting of `mnist`, the dense pathway, 28 x 28 x 1, and the
   smallest held-out split (2 digits), so that both train on the same digits.
4. Scores every model on the same test digits, read from WORK/png/rest (unseen by all), each
   dequantized once with the same noise and put in each model's own units: K per digit in the units
   of [0, 1) pixels (eq-mnist-units), averaged per model. The two pipelines are compared over seeds:
   the difference of their means, its standard error sqrt(s_a^2/n + s_b^2/n) (training noise
   included) and Welch's t-test; same K when the difference is within 2 standard errors. A seed
   starts both from the same weights, so the differences by seed are printed too.

Prints the figures and writes results/own_data_mnist.json. Usage:
    python bench/own_data_mnist.py [STEPS] [SEEDS] [N_EVAL] [WORK]   (12000, 5, 500, a temp dir)
"""
import functools, json, math, os, subprocess, sys, tempfile, time
from pathlib import Path
import numpy as np
import torch
from PIL import Image
from scipy import stats
from dpm.cli import get_experiment
from dpm.data import load_mnist, model_scaler
from dpm.dead_leaves import dequantize
from dpm.experiments import load_model, machine, repo_root
from dpm.own_data import IMAGES, read_images, per_example_bound
from dpm.diffusion import LN2
from dpm.training import TRAIN_DEFAULTS

MNIST_TRAIN = 50_000                 # the mnist experiment's training split: train[:50000]
D = 784


@functools.cache
def mnist_digits() -> torch.Tensor:
    "MNIST's 70,000 digits as the files number them: (70000, 1, 28, 28) uint8."
    return torch.cat([load_mnist('trainval').images,
                      load_mnist('test').images]).reshape(-1, 1, 28, 28)


def write_pngs(png: Path) -> float:
    "The 70,000 digits as PNG files in png/train and png/rest; seconds (0: they were there)."
    folders = (png / 'train', png / 'rest')
    if all(f.is_dir() for f in folders) and sum(len(os.listdir(f)) for f in folders) == 70_000:
        return 0.0
    t0 = time.perf_counter()
    for f in folders: f.mkdir(parents=True, exist_ok=True)
    for i, a in enumerate(mnist_digits().numpy()):
        Image.fromarray(a[0], 'L').save(folders[i >= MNIST_TRAIN] / f'{i:05d}.png')
    return time.perf_counter() - t0


def read_back(folder: Path) -> tuple:
    "(MNIST indices, levels) of a folder read by chapter 15c's reader; stops unless they are MNIST's."
    got = read_images(folder, size=28, channels=1)
    index = [int(Path(f).stem) for f in got.files]
    if not np.array_equal(got.images, mnist_digits()[index].numpy()):
        sys.exit(f"the reader's digits of {folder} differ from MNIST's")
    return index, torch.from_numpy(got.images)


def shared_settings(steps: int) -> dict:
    "The mnist experiment's full-scale settings that the images experiment has, and its own."
    from dpm.mnist import MNIST
    cfg = MNIST.resolve({'steps': steps, 'eval_every': 0})
    own = IMAGES.config.keys() | TRAIN_DEFAULTS.keys()               # what images can be set
    keep = {k: v for k, v in cfg.items() if k in own and k not in ('n_eval', 'seed')}
    return keep | dict(pathway='dense', size=28, channels=1, heldout=1e-6)   # 2 held out


def commands(work: Path, steps: int, seeds: int, settings: dict) -> dict:
    "The dpm commands of every run not yet trained: name -> argv."
    sets = [a for k, v in settings.items() for a in ('--set', f'{k}={json.dumps(v)}')]
    cmds = {}
    for s in range(seeds):
        cmds[f'mnist{s}'] = ['dpm', 'train', 'mnist', '--out', str(work / f'mnist{s}'), '--seed',
                             str(s), '--no-progress', '--set', f'steps={steps}', '--set',
                             'eval_every=0']
        cmds[f'own{s}'] = ['dpm', 'train', 'images', '--data', str(work / 'png' / 'train'), '--out',
                           str(work / f'own{s}'), '--seed', str(s), '--no-progress', *sets]
    return {k: v for k, v in cmds.items() if not (work / k / 'model.pt').exists()}


def train_all(work: Path, steps: int, seeds: int, settings: dict, at_once: int = 2) -> float:
    "Every run, `at_once` processes at a time, one thread each; their logs in WORK; wall seconds."
    env = dict(os.environ, DPM_SMALL='0', OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    todo, running, t0 = list(commands(work, steps, seeds, settings).items()), {}, time.perf_counter()
    while todo or running:
        while todo and len(running) < at_once:
            name, cmd = todo.pop(0)
            log = open(work / f'{name}.log', 'w')
            running[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        for name, p in list(running.items()):
            if p.poll() is not None:
                if p.returncode: sys.exit(f"{name} failed ({p.returncode}); see {work}/{name}.log")
                del running[name]
        time.sleep(1)
    return time.perf_counter() - t0


@torch.no_grad()
def unit_bound(path: Path, experiment: str, levels: torch.Tensor, noise_seed: int = 7):
    "K per digit in nats in the units of [0, 1) pixels (eq-mnist-units), and the training record."
    d, reverse, info, cfg = load_model(get_experiment(experiment), path)
    y = dequantize(levels, generator=torch.Generator().manual_seed(noise_seed))
    sc = model_scaler(d)
    torch.manual_seed(noise_seed + 1)                             # the same x_t draws for all
    return per_example_bound(d, reverse, sc.forward(y).float()) + D * sc.log_det_per_dim, info


def main(steps: int, seeds: int, n_eval: int, work: Path):
    seconds = write_pngs(work / 'png')
    print(f"70,000 PNG files in {work / 'png'}" + (f", written in {seconds:.0f} s" if seconds else ''))
    train_index, _ = read_back(work / 'png' / 'train')
    rest_index, rest = read_back(work / 'png' / 'rest')
    assert train_index == list(range(MNIST_TRAIN))
    print(f"the reader gave back all {len(train_index) + len(rest_index):,} digits level for level")
    settings = shared_settings(steps)
    wall = train_all(work, steps, seeds, settings)
    print(f"{2 * seeds} models of {steps:,} steps, two processes at a time: {wall:.0f} s wall")
    test = [j for j, i in enumerate(rest_index) if i >= 60_000][:n_eval]     # MNIST's test digits
    runs = {}
    for name, exp in [(f'{p}{s}', e) for p, e in (('mnist', 'mnist'), ('own', 'images'))
                      for s in range(seeds)]:
        k, info = unit_bound(work / name / 'model.pt', exp, rest[test])
        runs[name] = dict(K_bits_per_pixel=k.mean().item() / D / LN2, steps=info['steps'],
                          train_seconds=info['train_seconds'],
                          n_train=sum(r['n'] for r in info['data'] if r.get('split') == 'train'))
        print(f"{name:>7}: K = {runs[name]['K_bits_per_pixel']:.4f} bits per pixel after "
              f"{info['steps']:,} steps on {runs[name]['n_train']:,} digits")
    K = {p: np.array([runs[f'{p}{s}']['K_bits_per_pixel'] for s in range(seeds)])
         for p in ('mnist', 'own')}
    diff = K['own'].mean() - K['mnist'].mean()
    se = math.sqrt(K['own'].var(ddof=1) / seeds + K['mnist'].var(ddof=1) / seeds)
    p = float(stats.ttest_ind(K['own'], K['mnist'], equal_var=False).pvalue)
    by_seed = K['own'] - K['mnist']                  # one seed: the same initial weights
    paired_se, paired_p = by_seed.std(ddof=1) / math.sqrt(seeds), float(stats.ttest_1samp(
        by_seed, 0.0).pvalue)
    verdict = 'same' if abs(diff) <= 2 * se else 'different'
    for name in ('mnist', 'own'):
        print(f"{name:>7}: mean K {K[name].mean():.4f}, sd over seeds {K[name].std(ddof=1):.4f}")
    print(f"own - mnist: {diff:+.4f} +- {se:.4f} bits per pixel over {seeds} seeds each "
          f"({abs(diff) / se:.2f} standard errors, Welch p = {p:.2f}) on {len(test)} test digits: "
          f"{verdict} K within 2 standard errors")
    print(f"paired by seed (the same initial weights): {by_seed.mean():+.4f} +- {paired_se:.4f} "
          f"(p = {paired_p:.2f})")
    m = machine()
    print(f"machine: {m['processor']}, {m['cpus']} CPUs, torch {m['torch']}")
    record = dict(steps=steps, seeds=seeds, n_eval=len(test), runs=runs, own_minus_mnist=diff,
                  se=se, welch_p=p, verdict=verdict, paired_se=paired_se, paired_p=paired_p, settings=settings, machine=m,
                  wall_seconds=wall)
    (repo_root() / 'results' / 'own_data_mnist.json').write_text(json.dumps(record, indent=1))


if __name__ == '__main__':
    os.environ['DPM_SMALL'] = '0'                      # full scale, here and in the dpm commands
    a = sys.argv[1:]
    steps, seeds, n_eval = (int(a[i]) if len(a) > i else v for i, v in enumerate((12_000, 5, 500)))
    if len(a) > 3: main(steps, seeds, n_eval, Path(a[3]))
    else:
        with tempfile.TemporaryDirectory() as tmp: main(steps, seeds, n_eval, Path(tmp))
