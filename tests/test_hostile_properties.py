"""Property-based tests (hypothesis) of the error path: generated command lines and KEY=VALUE settings,
CIFAR-10 batches made of generated or mutated bytes, and checkpoints made of mutated dicts. Each ends
in a result or in one of dpm's own errors, never in anything else. Bounded: `max_examples` and a
`deadline` per example keep the file to a few seconds."""
import json, math, os, pickle, tempfile
from datetime import timedelta
from pathlib import Path
from unittest import mock
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from hostile_helpers import cifar_batch, py2_cifar_batch, toy_model
from dpm.settings import ConfigError, DataError, DpmError, check_config
from dpm.checkpoints import CheckpointError, atomic_save
from dpm.training import TrainConfig, load_checkpoint, train, TRAIN_KEYS
from dpm.experiments import build, experiment_data, load_model
from dpm.data import read_cifar_batch

BOUNDED = dict(deadline=timedelta(seconds=5), suppress_health_check=list(HealthCheck), derandomize=True,
               database=None)                         # the same examples every run, nothing written
WORK = Path(tempfile.mkdtemp(prefix='dpm-hostile-'))


def _trained():
    if not (WORK / 'toy' / 'model.pt').exists():
        os.environ['DPM_SMALL'] = '1'
        toy_model(WORK / 'toy')
    return WORK / 'toy'


# command lines and settings --------------------------------------------------------------------------
text = st.text(st.characters(blacklist_categories=('Cs',), blacklist_characters='\x00'), max_size=20)
json_value = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 80, 2 ** 80) | st.floats() | text,
                          lambda c: st.lists(c, max_size=3) | st.dictionaries(text, c, max_size=3), max_leaves=8)
deep = st.integers(1, 3000).map(lambda n: '[' * n + ']' * n)
value = st.one_of(json_value.map(json.dumps), text, deep, st.integers(-2 ** 200, 2 ** 200).map(str))
known_keys = sorted(set(TRAIN_KEYS) | {'T', 'noise', 'width', 'depth', 'n_train', 'model', 'x_features'})
key = st.one_of(st.sampled_from(known_keys), text)
setting = st.one_of(st.tuples(key, value).map('='.join), text)
number = st.one_of(st.integers(-2 ** 70, 2 ** 70).map(str), st.floats().map(repr), text)
device = st.one_of(st.sampled_from(['cpu', 'cuda', 'cuda:7', 'xpu', 'mps', 'meta', 'auto', 'lazy', 'gpu']), text)


class Reached(Exception):
    "The command got past every check to the work itself (stubbed out here)."


@st.composite
def command_lines(draw):
    cmd = draw(st.sampled_from(['train', 'evaluate', 'sample', 'upgrade', 'list']) | text)
    argv = [cmd]
    if draw(st.booleans()): argv.append(draw(st.sampled_from(['swiss_roll', 'heartbeat', 'nope']) | text))
    if draw(st.booleans()): argv += ['--out', draw(st.sampled_from(['out', 'model.pt', 'none']) | text)]
    for _ in range(draw(st.integers(0, 4))):
        opt = draw(st.sampled_from(['--seed', '-n', '--device', '--set', '--config', '--small', '--debug', '--x']))
        argv.append(opt)
        if opt in ('--seed', '-n'): argv.append(draw(number))
        elif opt == '--device': argv.append(draw(device))
        elif opt == '--set': argv.append(draw(setting))
        elif opt == '--config': argv.append(draw(st.sampled_from(['cfg.json', 'deep.json', 'out', 'none']) | text))
    return argv


@settings(max_examples=150, **BOUNDED)
@given(argv=command_lines())
def test_any_command_line_ends_in_one_line_or_reaches_the_work(argv):
    "Whatever the arguments: a usage line (status 2), one `dpm:` line, a listing, or the work itself."
    from dpm.cli import main
    (WORK / 'out').mkdir(exist_ok=True); (WORK / 'out' / 'model.pt').write_bytes(b'stub')
    (WORK / 'cfg.json').write_text('{"steps": 3}'); (WORK / 'deep.json').write_text('[' * 5000 + ']' * 5000)
    if '--debug' in argv: argv = [a for a in argv if a != '--debug']   # --debug shows tracebacks by design
    stub, cwd = mock.Mock(side_effect=Reached), os.getcwd()
    with mock.patch('dpm.cli.run', stub), mock.patch('dpm.cli.load_model', stub), \
         mock.patch('dpm.cli.upgrade_checkpoint', stub), mock.patch.dict(os.environ, {'DPM_SMALL': '1'}):
        os.chdir(WORK)                                                  # relative paths land here
        try: main(argv)
        except Reached: return
        except SystemExit as e:
            if e.code == 2: return                                      # argparse's usage error, one line
            msg = str(e.code)
            assert msg.startswith('dpm: ') and '\n' not in msg and not msg.startswith('dpm: dpm:'), msg
            return
        finally: os.chdir(cwd)
    assert argv[0] == 'list', argv


@settings(max_examples=200, **BOUNDED)
@given(sets=st.lists(setting, max_size=5), name=st.sampled_from(['swiss_roll', 'heartbeat', 'cifar10', 'bark']))
def test_any_settings_are_refused_or_valid(sets, name):
    "KEY=VALUE pairs: a ConfigError, or a configuration every check and TrainConfig accept."
    from dpm.cli import parse_overrides, get_experiment
    exp = get_experiment(name)
    with mock.patch.dict(os.environ, {'DPM_SMALL': '1'}):
        try: cfg = exp.resolve(parse_overrides(sets=sets))
        except ConfigError as e:
            assert '\n' not in str(e) and len(str(e)) < 2000, str(e)
            return
    check_config(cfg, exp.schema())
    TrainConfig.from_dict(cfg)


# CIFAR-10 batches from generated bytes -------------------------------------------------------------
def _read(raw: bytes):
    p = WORK / 'batch'; p.write_bytes(raw)
    try: x, y = read_cifar_batch(p)
    except DataError as e:
        assert str(p) in str(e) and '\n' not in str(e), str(e)
        return None
    assert x.dtype == np.uint8 and x.shape[1:] == (3, 32, 32) and y.shape == (len(x),) and len(x) >= 1
    assert y.dtype == np.int64 and ((0 <= y) & (y <= 9)).all()
    return x, y


@settings(max_examples=150, **BOUNDED)
@given(raw=st.binary(max_size=2000))
def test_cifar_reader_on_arbitrary_bytes(raw):
    _read(raw)


@settings(max_examples=150, **BOUNDED)
@given(protocol=st.integers(0, 6), edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True),
                                                            st.integers(0, 255)), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.floats(0, 1)))
def test_cifar_reader_on_mutated_batches(protocol, edits, cut):
    "A valid batch (any protocol, or as Python 2 wrote it), bytes changed or cut: a batch or a DataError."
    raw = bytearray(py2_cifar_batch(np.arange(2 * 3072).reshape(2, 3072).astype(np.uint8), [3, 4])
                    if protocol == 6 else cifar_batch(2, protocol=protocol))
    for where, byte in edits: raw[int(where * len(raw))] = byte
    if cut is not None: raw = raw[:int(cut * len(raw))]
    _read(bytes(raw))


arrays = st.builds(lambda dt, shape: np.zeros(shape, dt), st.sampled_from(['u1', 'i8', 'f4', 'f8', 'b1', 'c8', 'O']),
                   st.lists(st.integers(0, 3100), max_size=2).map(tuple).filter(lambda s: math.prod(s) < 20000))
objects = st.recursive(st.none() | st.integers(-20, 2 ** 70) | st.binary(max_size=8) | text | arrays,
                       lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from([b'data', b'labels', 'data', 'x']),
                                                                            c, max_size=3), max_leaves=8)


@settings(max_examples=150, **BOUNDED)
@given(obj=objects, protocol=st.integers(0, 5))
def test_cifar_reader_on_generated_pickles(obj, protocol):
    out = _read(pickle.dumps(obj, protocol=protocol))
    if out is not None: assert isinstance(obj, dict)


# checkpoints from generated dicts ----------------------------------------------------------------------
leaf = st.one_of(json_value, st.builds(lambda dt, shape: torch.zeros(shape, dtype=dt),
                                       st.sampled_from([torch.float32, torch.float64, torch.uint8, torch.int64,
                                                        torch.bool]),
                                       st.lists(st.integers(0, 5), max_size=3)))


@st.composite
def mutations(draw, keys):
    "(path, new value or None to delete): a top-level key, or one key inside it."
    top = draw(st.sampled_from(keys) | text)
    inner = draw(st.none() | text | st.sampled_from(['lr', 'steps', 'ema', 'seed', 'state', 'param_groups']))
    return (top,) if inner is None else (top, inner), draw(st.none() | leaf)


def _mutated(src: Path, muts) -> Path:
    ck = torch.load(src, weights_only=True); ck.pop('checksum')
    for path, v in muts:
        d = ck
        for k in path[:-1]:
            d = d.get(k) if isinstance(d, dict) else None
        if not isinstance(d, dict): continue
        if v is None: d.pop(path[-1], None)
        else: d[path[-1]] = v
    out = WORK / f'mutated-{src.name}'
    atomic_save(ck, out)                                     # a valid checksum: only the structure can save it
    return out


def _toy_data():
    "The configuration and data the toy model was trained with (drawn once)."
    from dpm.swiss_roll import SWISS_ROLL
    if not hasattr(_toy_data, 'cached'):
        with mock.patch.dict(os.environ, {'DPM_SMALL': '1'}):
            cfg = SWISS_ROLL.resolve(dict(steps=20, T=10, eval_every=10)); cfg['seed'] = 0
        _toy_data.cached = (cfg, *experiment_data(SWISS_ROLL, cfg))
    return _toy_data.cached


TRAIN_CK_KEYS = ['format', 'model', 'optimizer', 'ema', 'rng', 'gen', 'cuda_rng', 'step', 'history',
                 'train_seconds', 'running', 'restarts', 'config', 'signature']


@settings(max_examples=40, **BOUNDED)
@given(muts=st.lists(mutations(TRAIN_CK_KEYS), min_size=1, max_size=3))
def test_mutated_training_checkpoints_are_refused_or_resume(muts):
    "A checkpoint changed anywhere, with a valid checksum: refused with a CheckpointError, or it resumes."
    from dpm.swiss_roll import SWISS_ROLL
    try: path = _mutated(_trained() / 'checkpoint.pt', muts)
    except CheckpointError: return                           # too deep to checksum: refused on writing
    try: ck = load_checkpoint(path)
    except CheckpointError as e:
        assert '\n' not in str(e); return
    cfg, x, h = _toy_data()
    d, rev = build(SWISS_ROLL, cfg)
    tc = TrainConfig.from_dict({**cfg, 'steps': min(ck['step'] + 1, 2 ** 53), 'eval_every': 0})
    try: train(d, rev, x, h, tc, checkpoint=path, progress=False, full_config=cfg)
    except (CheckpointError, FloatingPointError): pass


MODEL_KEYS = ['format', 'kind', 'experiment', 'model', 'config', 'signature', 'info']


@settings(max_examples=40, **BOUNDED)
@given(muts=st.lists(mutations(MODEL_KEYS), min_size=1, max_size=3))
def test_mutated_model_files_are_refused_or_load(muts):
    from dpm.swiss_roll import SWISS_ROLL
    try: path = _mutated(_trained() / 'model.pt', muts)
    except CheckpointError: return
    try: load_model(SWISS_ROLL, path)
    except CheckpointError as e: assert '\n' not in str(e)
