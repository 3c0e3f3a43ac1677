"""The GPU campaign's file path, on the CPU: bf16 shards of a model file (bench/weights.py) and back,
shards that do not belong together refused in one line, a warm restart (`dpm train --init`) from
the unpacked file, and a resume from a packed training checkpoint (its state), as
bench/gpu_campaign.sh does them between two GPU runs."""
import importlib.util, json, os, subprocess, sys
from pathlib import Path
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, 'DPM_SMALL': '1', 'MPLBACKEND': 'Agg', 'OMP_NUM_THREADS': '1',
       'PYTHONPATH': str(ROOT)}
spec = importlib.util.spec_from_file_location('weights', ROOT / 'bench' / 'weights.py')
weights = importlib.util.module_from_spec(spec); spec.loader.exec_module(weights)
TINY = 4096                                      # bytes per shard: a small model in many shards
SMALL = 64                                       # float32 tensors of fewer elements stay exact


def sh(*args, check=True):
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=ENV)
    if check and r.returncode: raise AssertionError(f'{args} failed:\n{r.stdout}\n{r.stderr}')
    return r


def dpm(*args, **kw): return sh('-m', 'dpm', *args, **kw)


def one_line(r, *words):
    "Refused: non-zero exit, one line on stderr naming `words`, no traceback."
    assert r.returncode != 0 and 'Traceback' not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for w in words: assert w in r.stderr, (w, r.stderr)


@pytest.fixture(scope='module')
def models(tmp_path_factory):
    "Two small dead-leaves models (with a linear path): 4 steps, and 8 steps warm-restarted from it."
    w = tmp_path_factory.mktemp('models')
    quick = ['--set', 'eval_every=0', '--no-progress']
    dpm('train', 'dead_leaves', '--out', str(w / 'a' / 'dead_leaves'), '--set', 'steps=4', *quick)
    dpm('train', 'dead_leaves', '--out', str(w / 'b' / 'dead_leaves'), '--set', 'steps=8', *quick,
        '--init', str(w / 'a' / 'dead_leaves' / 'model.pt'))
    return w


def test_round_trip_in_tiny_shards(models, tmp_path):
    from dpm.training import load_checkpoint
    from dpm.experiments import load_model
    from dpm.dead_leaves import DEAD_LEAVES
    model = models / 'a' / 'dead_leaves' / 'model.pt'
    shards = weights.pack(tmp_path / 'shards', [model], shard=TINY, exact_below=SMALL)
    assert len(shards) > 3 and [p.name for p in shards][:2] == ['dead_leaves.bf16.00.pt',
                                                                 'dead_leaves.bf16.01.pt']
    assert all(torch.load(p, weights_only=True)['data'].numel() <= TINY for p in shards)
    weights.unpack(tmp_path / 'back' / 'model.pt', shards)
    d, rev, info, cfg = load_model(DEAD_LEAVES, tmp_path / 'back' / 'model.pt')
    before, after = load_checkpoint(model), load_checkpoint(tmp_path / 'back' / 'model.pt')
    assert after['config'] == before['config'] and after['info'] == before['info']
    lin = [k for k, v in before['model'].items() if '.lin_' in k and v.numel() >= SMALL]
    assert lin, 'the small dead-leaves model has a linear path: its eigenbasis must be tested'
    rounded = 0
    for k, v in before['model'].items():
        got = after['model'][k]
        assert got.dtype == v.dtype and got.shape == v.shape, k
        if '.lin_' in k or v.dtype != torch.float32 or v.numel() < SMALL:
            assert torch.equal(got, v), k                                            # exact
        else:
            assert torch.equal(got, v.bfloat16().float()), k                        # bf16 rounding
            assert torch.allclose(got, v, rtol=2 ** -8, atol=2 ** -126), k
            rounded += not torch.equal(got, v)
    assert rounded >= 3, rounded


def test_unpack_refuses_shards_that_do_not_belong_together(models, tmp_path):
    a = weights.pack(tmp_path / 'a', [models / 'a' / 'dead_leaves' / 'model.pt'], shard=TINY)
    b = weights.pack(tmp_path / 'b', [models / 'b' / 'dead_leaves' / 'model.pt'], shard=TINY)
    out = str(tmp_path / 'x.pt')
    one_line(sh('bench/weights.py', 'unpack', out, *map(str, [a[0], *b[1:]]), check=False),
             'different models or packs')
    one_line(sh('bench/weights.py', 'unpack', out, *map(str, [*a[:2], *a[3:]]), check=False),
             'shard(s) 02 of', 'missing')
    one_line(sh('bench/weights.py', 'unpack', out, *map(str, a[:-1]), check=False), 'missing')
    one_line(sh('bench/weights.py', 'unpack', out, *map(str, [*a, a[1]]), check=False),
             'given twice')
    raw = tmp_path / 'dead_leaves.bf16.99.pt'; raw.write_bytes(b'x' * 100)
    one_line(sh('bench/weights.py', 'unpack', out, *map(str, [*a, raw]), check=False),
             'not a shard')
    bad = torch.load(a[1], weights_only=True); bad['data'][0] ^= 1; torch.save(bad, a[1])
    one_line(sh('bench/weights.py', 'unpack', out, *map(str, a), check=False), 'sha256')
    one_line(sh('bench/weights.py', 'pack', str(tmp_path / 'c'),
                str(models / 'a' / 'dead_leaves' / 'checkpoint.pt'), check=False),
             'training checkpoint')
    one_line(sh('bench/weights.py', 'pack', '--state', str(tmp_path / 'c'),
                str(models / 'a' / 'dead_leaves' / 'model.pt'), check=False), 'model file')
    assert not Path(out).exists()


def test_a_state_pack_resumes_the_optimisation(models, tmp_path):
    """A checkpoint packed in bf16 shards (--state) and written back by `resume`: `dpm train` resumes
    from it with Adam's moments and the weight average, and the record counts the round trip."""
    from dpm.training import load_checkpoint
    run = models / 'b' / 'dead_leaves'
    parts = weights.pack(tmp_path / 'packs', [run / 'checkpoint.pt'], shard=TINY, state=True)
    assert parts[0].name == 'dead_leaves.state.bf16.00.pt'
    with pytest.raises(weights.CheckpointError, match='training checkpoint'):
        weights.unpack(tmp_path / 'x.pt', parts)
    out = tmp_path / 'next'
    weights.resume(out / 'checkpoint.pt', parts)
    before, after = load_checkpoint(run / 'checkpoint.pt'), load_checkpoint(out / 'checkpoint.pt')
    assert after['step'] == before['step'] == 8 and after['optimizer']['state']
    for i, s in before['optimizer']['state'].items():                 # Adam's moments, rounded
        for k in ('exp_avg', 'exp_avg_sq'):
            assert torch.allclose(after['optimizer']['state'][i][k], s[k], rtol=2 ** -8, atol=1e-30)
    assert after['restarts'][-1]['optimiser'] == 'kept' and after['restarts'][-1]['step'] == 8
    r = dpm('train', 'dead_leaves', '--out', str(out), '--set', 'steps=12', '--set', 'eval_every=0',
            '--no-progress')
    assert 'warm restart' not in r.stdout, r.stdout                    # resumed, not restarted
    rec = json.loads((out / 'training.json').read_text())
    assert rec['steps'] == 12 and [x['step'] for x in rec['restarts']] == [4, 8]
    assert 'resumed with the optimiser' in weights.summary(out / 'training.json')


def test_warm_restart_from_unpacked_shards(models, tmp_path):
    "The campaign's path: shards -> model.pt -> `dpm train --init`; records sum steps and time."
    first = models / 'b' / 'dead_leaves'
    shards = weights.pack(tmp_path / 'shards', [first / 'model.pt'], shard=TINY)
    weights.unpack(tmp_path / 'init' / 'model.pt', shards)
    out = tmp_path / 'next'
    r = dpm('train', 'dead_leaves', '--out', str(out), '--set', 'steps=12', '--set', 'eval_every=0',
            '--no-progress', '--init', str(tmp_path / 'init' / 'model.pt'))
    assert 'warm restart from' in r.stdout and 'step 8' in r.stdout
    rec, prev = (json.loads((p / 'training.json').read_text()) for p in (out, first))
    assert rec['steps'] == 12 and [x['step'] for x in rec['restarts']] == [4, 8]
    assert rec['train_seconds'] > prev['train_seconds']
    again = dpm('train', 'dead_leaves', '--out', str(out), '--set', 'steps=12', '--set', 'eval_every=0',
                '--no-progress', '--init', str(tmp_path / 'init' / 'model.pt'))
    assert 'ignored' in again.stdout and len(json.loads((out / 'training.json').read_text())['restarts']) == 2
    one_line(dpm('train', 'dead_leaves', '--out', str(tmp_path / 'other'), '--set', 'steps=12',
                 '--set', 'lr=0.5', '--no-progress', '--init', str(tmp_path / 'init' / 'model.pt'),
                 check=False), 'another configuration', 'lr')
    one_line(dpm('train', 'swiss_roll', '--out', str(tmp_path / 'other2'), '--no-progress',
                 '--init', str(tmp_path / 'init' / 'model.pt'), check=False), "not of 'swiss_roll'")



def test_warm_restart_refuses_weights_of_other_training_data(tmp_path):
    "A model file whose record names other training data (a changed stand-in) is not warm-started."
    from dpm.checkpoints import atomic_save
    from dpm.training import load_checkpoint
    quick = ['--set', 'eval_every=0', '--no-progress']
    dpm('train', 'mnist', '--out', str(tmp_path / 'first'), '--set', 'steps=2', *quick)  # + its data
    ck = load_checkpoint(tmp_path / 'first' / 'model.pt')
    assert any(r.get('split') == 'train' and r.get('checksum') for r in ck['info']['data'])
    ck['info']['data'] = [dict(r, checksum='0' * 64) if r.get('split') == 'train' else r
                          for r in ck['info']['data']]
    atomic_save({k: v for k, v in ck.items() if k != 'checksum'}, tmp_path / 'old.pt')
    r = dpm('train', 'mnist', '--out', str(tmp_path / 'next'), *quick, '--set', 'steps=4',
            '--init', str(tmp_path / 'old.pt'), check=False)
    one_line(r, 'other training data', 'start afresh')
    assert not (tmp_path / 'next' / 'model.pt').exists()
    dpm('train', 'mnist', '--out', str(tmp_path / 'same'), *quick, '--set', 'steps=4',
        '--init', str(tmp_path / 'first' / 'model.pt'))                  # the same data: warm start

@pytest.mark.parametrize('name', ['mnist', 'cifar10', 'dead_leaves', 'bark'])
def test_committed_weights_unpack_to_the_recorded_model(name, tmp_path):
    "results/<name>_gpu/weights: the model the committed record describes, loadable for --init."
    from dpm.cli import get_experiment
    from dpm.experiments import load_model
    shards = sorted((ROOT / 'results' / f'{name}_gpu' / 'weights').glob(f'{name}_gpu.bf16.*.pt'))
    if not shards: pytest.skip(f'no committed weights for {name}_gpu')
    weights.unpack(tmp_path / 'model.pt', shards)
    d, rev, info, cfg = load_model(get_experiment(f'{name}_gpu'), tmp_path / 'model.pt')
    record = json.loads((ROOT / 'results' / f'{name}_gpu' / 'training.json').read_text())
    assert info['steps'] == record['steps'] and info.get('restarts', []) == record.get('restarts', [])


def test_curve_rule_stops_when_parzen_has_stopped_rising(tmp_path):
    "bench/curve_rule.py: eq-mnist-stop over a run's folder and new points; the verdict in a record."
    def record(path, steps, bits, schedule=1_000_000, **training):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(config=dict(steps=schedule), numbers=dict(parzen_bits=bits),
                                        training=dict(steps=steps, **training))))
    run = tmp_path / 'results' / 'mnist_gpu'
    record(run / 'curve' / 'step_100.json', 100, 300.0, schedule=150)       # an earlier schedule
    for k, b in [(200, 270.0), (300, 276.0)]: record(run / 'curve' / f'step_{k}.json', k, b)
    record(run / 'record.json', 400, 279.0)
    new = tmp_path / 'work'
    record(new / 'a' / 'record.json', 500, 278.5)
    r = sh('bench/curve_rule.py', str(run), str(new / 'a'), check=False)
    assert r.returncode == 1 and r.stdout.startswith('go on'), r.stdout + r.stderr   # one below
    record(new / 'b' / 'record.json', 600, 279.0, stopped_early=True)
    r = sh('bench/curve_rule.py', str(run), str(new / 'a'), str(new / 'b'),
           '--write', str(new / 'b' / 'record.json'), check=False)
    assert r.returncode == 0 and 'stop: the Parzen estimate has not risen' in r.stdout, r.stdout
    stop = json.loads((new / 'b' / 'record.json').read_text())['stop']
    assert stop['stopped'] and '279.0 bits at step 400' in stop['reason']
    assert [p[0] for p in stop['points']] == [100, 200, 300, 400, 500, 600]
    (new / 'bad.json').write_text('{')
    one_line(sh('bench/curve_rule.py', str(new / 'bad.json'), check=False), 'not a JSON record')
