"""The CPU allocator setting (appendix A6) and the value checks that read a tensor's two ends (01):
on glibc, dpm's chains (sampling, the bound, training) keep freed memory for the next step, which
DPM_KEEP_MEMORY=0 turns off; a no-op where there is no glibc; a reverse model that goes bad at one
step of one example still stops sampling and evaluation with the same one-line error."""
import json
import os
import subprocess
import sys

import pytest
import torch

from dpm import cpu_memory
from dpm.diffusion import BinomialDiffusion, GaussianDiffusion, binomial_schedule

ON_GLIBC = cpu_memory.glibc() is not None
glibc_only = pytest.mark.skipif(not ON_GLIBC, reason='the setting applies to glibc only')

CHILD = """
import json, resource, torch, dpm
from dpm.diffusion import GaussianDiffusion
def reverse(x, t):                                           # 32 MiB of activations a step
    torch.ones(8 * 2 ** 20)
    return torch.zeros_like(x), torch.full_like(x, 0.1)
d = GaussianDiffusion(torch.full((9,), 0.1))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
d.sample(reverse, (4, 3))                                    # 8 steps through the model
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps(dict(state=dpm.cpu_memory.ALLOCATOR, faults=faults)))
"""


def _child(**env):
    clean = {k: v for k, v in os.environ.items()
             if k not in (*cpu_memory.GLIBC_SETTINGS, 'GLIBC_TUNABLES', cpu_memory.SETTING)}
    out = subprocess.run([sys.executable, '-c', CHILD], env={**clean, **env}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


@glibc_only
def test_sampling_keeps_freed_memory_and_the_setting_turns_it_off():
    pages = 8 * 2 ** 20 * 4 // 4096                          # one tensor's pages
    on, off = _child(), _child(DPM_KEEP_MEMORY='0')
    assert on['state'] == 'on' and off['state'] == 'off (DPM_KEEP_MEMORY=0)'
    assert off['faults'] > 6 * pages                         # every allocation faults its pages
    assert on['faults'] < 2.5 * pages                        # the heap's growth, then reuse


@glibc_only
def test_glibcs_own_settings_are_left_alone():
    assert _child(MALLOC_MMAP_THRESHOLD_='65536')['state'] == "off (glibc's own settings)"
    tuned = _child(GLIBC_TUNABLES='glibc.malloc.trim_threshold=65536')
    assert tuned['state'] == "off (glibc's own settings)"


@pytest.mark.parametrize('platform, confstr', [
    ('darwin', None), ('win32', None),
    ('linux', ValueError('unrecognized configuration name')),    # musl: no glibc name
    ('linux', 'musl libc'),
])
def test_no_op_without_glibc(monkeypatch, platform, confstr):
    def never(*a, **k): raise AssertionError('the C library must not be touched here')
    monkeypatch.setattr(cpu_memory.sys, 'platform', platform)
    monkeypatch.setattr(cpu_memory.ctypes, 'CDLL', never)
    if confstr is not None:
        def fake(name):
            if isinstance(confstr, Exception): raise confstr
            return confstr
        monkeypatch.setattr(cpu_memory.os, 'confstr', fake)
    assert cpu_memory.glibc() is None
    assert cpu_memory.allocator_setting({}).startswith('not applicable')
    assert cpu_memory.release_freed_memory() is False
    monkeypatch.setattr(cpu_memory, '_libc', None)           # as at import without glibc
    with cpu_memory.kept_memory(): assert cpu_memory._depth == 0


def _bad_at(step, value, where='mean'):
    "A Gaussian reverse model that is fine except at one step, for one element of one example."
    def model(xt, t):
        mean, var = torch.zeros_like(xt), torch.full_like(xt, 0.1)
        if int(t[0]) == step: (mean if where == 'mean' else var)[1, 2] = value
        return mean, var
    return model


@pytest.mark.parametrize('value, where, message', [
    (float('nan'), 'mean', 'reverse model returned NaN or inf'),
    (float('inf'), 'mean', 'reverse model returned NaN or inf'),
    (-float('inf'), 'var', 'reverse model returned NaN or inf'),
    (float('nan'), 'var', 'reverse model returned NaN or inf'),
    (0.0, 'var', 'reverse model returned a non-positive variance'),
])
def test_one_bad_value_at_one_step_stops_sampling_and_the_bound(value, where, message):
    d = GaussianDiffusion(torch.full((10,), 0.1))
    with pytest.raises(ValueError, match=message):
        d.sample(_bad_at(7, value, where), (4, 3))
    with pytest.raises(ValueError, match=message):
        d.bound_estimate(_bad_at(7, value, where), torch.zeros(4, 3),
                         t=torch.full((4,), 7, dtype=torch.long))
    d.sample(_bad_at(99, value, where), (4, 3))              # the same model, never bad: samples


@pytest.mark.parametrize('value, message', [
    (float('nan'), 'reverse model returned NaN or inf'),
    (1.5, r'outside \[0, 1\]'), (-0.5, r'outside \[0, 1\]'),
])
def test_one_bad_probability_at_one_step_stops_binomial_sampling(value, message):
    bd = BinomialDiffusion(binomial_schedule(6))
    def model(xt, t):
        prob = torch.full_like(xt, 0.5)
        if int(t[0]) == 4: prob[0, 1] = value
        return prob
    with pytest.raises(ValueError, match=message):
        bd.sample(model, (3, 5))


def test_training_runs_inside_kept_memory(monkeypatch, tmp_path):
    "run() trains inside kept_memory(); its setting-up (data, model) runs outside."
    from dpm import experiments
    from dpm.cli import get_experiment
    seen = []
    real_train, real_data = experiments.train, experiments.experiment_data
    def train(*a, **k):
        seen.append(('train', cpu_memory._depth)); return real_train(*a, **k)
    def data(*a, **k):
        seen.append(('data', cpu_memory._depth)); return real_data(*a, **k)
    monkeypatch.setattr(experiments, 'train', train)
    monkeypatch.setattr(experiments, 'experiment_data', data)
    monkeypatch.setattr(cpu_memory, '_libc', cpu_memory._libc or _Recorder())
    experiments.run(get_experiment('swiss_roll'), tmp_path / 'run', dict(steps=3), progress=False)
    assert seen == [('data', 0), ('train', 1)]
    assert cpu_memory._depth == 0


class _Recorder:
    "Stands in for glibc where there is none: records mallopt calls."
    def __init__(self): self.calls = []
    def mallopt(self, option, value): self.calls.append((option, value)); return 1
