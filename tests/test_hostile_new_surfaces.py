"""Hostile input on the newer surfaces: README's and the manual's commands from an editable install,
notices that are not errors, weight packs (bench/weights.py, the campaign's install), signals,
campaign locks, distributed runs and committed records. Each test feeds the bad input and checks
the exit status, the one `dpm:` (or `weights.py:`) line, and that nothing written before changed."""
import hashlib, json, os, pickle, re, shutil, signal, subprocess, sys, sysconfig, tarfile, time
from pathlib import Path
import numpy as np
import pytest
import torch

from hostile_helpers import ROOT, ENV, QUICK, dpm, one_line, cifar_dir

WEIGHTS = ROOT / 'bench' / 'weights.py'


def tree(folder: Path) -> dict:
    "Every file under `folder` (relative path -> sha256): what 'nothing changed' compares."
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(folder).rglob('*')) if p.is_file()}


def script(*args, cwd=ROOT, env=None, timeout=300):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**ENV, **(env or {})}, timeout=timeout)


def refused(r, *words, prefix='dpm: '):
    "Non-zero exit, stderr one line starting with `prefix` and naming `words`, no traceback."
    err = r.stderr.strip()
    assert r.returncode != 0, (r.returncode, r.stdout, err)
    assert 'Traceback' not in err and len(err.splitlines()) == 1 and err.startswith(prefix), err
    for w in words: assert w in err, (w, err)
    return err


# 1. README's and the manual's commands, from an editable install ----------------------------------
BUILD = re.compile(r'^(bash |source |jupyter |pip |DPM_SMALL=1 nbdev_test)')
GPU = re.compile(r'--device cuda|torchrun|cifar10_gpu')        # a GPU's commands: not on a CPU
OWN = re.compile(r'--data |runs/(pts|img)\b')                   # the reader's own files: not here


def bash_commands(path: Path) -> list:
    "The commands of the ```bash blocks of a Markdown file, continuation lines joined, comments cut."
    cmds, block = [], None
    for line in path.read_text(encoding='utf-8').splitlines():
        if line.startswith('```'):
            block = [] if line.strip() == '```bash' and block is None else None
            continue
        if block is None: continue
        text = re.sub(r'\s+#.*$', '', line).rstrip()
        if cmds and cmds[-1].endswith('\\'): cmds[-1] = cmds[-1][:-1].rstrip() + ' ' + text.strip()
        elif text.strip(): cmds.append(text.strip())
    return cmds


def test_bash_blocks_are_parsed():
    cmds = bash_commands(ROOT / 'nbs' / 'using_dpm.md')
    assert 'dpm list' in cmds and any(c.endswith('--set max_minutes=60') for c in cmds), cmds


@pytest.fixture(scope='module')
def editable(tmp_path_factory):
    """A checkout's sources (the package, setup files and the committed models the commands use),
    installed with `pip install -e .` into a virtual environment of its own that sees this
    environment's torch; (its bin folder, the source folder)."""
    tmp = tmp_path_factory.mktemp('editable')
    src = tmp / 'src'; src.mkdir()
    for rel in ['setup.py', 'settings.ini', 'pyproject.toml', 'MANIFEST.in', 'README.md']:
        shutil.copy2(ROOT / rel, src / rel)
    shutil.copytree(ROOT / 'dpm', src / 'dpm', ignore=shutil.ignore_patterns('__pycache__', 'models'))
    (src / 'results' / 'models').mkdir(parents=True)
    for name in ['mnist.pt', 'swiss_roll.pt', 'digit_classifier.pt']:
        shutil.copy2(ROOT / 'results' / 'models' / name, src / 'results' / 'models' / name)
    shutil.copytree(ROOT / 'results' / 'mnist_gpu' / 'weights', src / 'results' / 'mnist_gpu' / 'weights')
    venv = tmp / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
    site = subprocess.run([str(venv / 'bin' / 'python'), '-c', 'import sysconfig; '
                           'print(sysconfig.get_paths()["purelib"])'], capture_output=True,
                          text=True, check=True).stdout.strip()
    Path(site, 'outer_env.pth').write_text(sysconfig.get_paths()['purelib'] + '\n')  # torch, pip
    r = subprocess.run([str(venv / 'bin' / 'python'), '-m', 'pip', 'install', '-q', '--no-deps',
                        '--no-build-isolation', '--disable-pip-version-check', '-e', str(src)],
                       capture_output=True, text=True, timeout=300, cwd=tmp)
    assert r.returncode == 0, f'pip install -e failed:\n{r.stdout}\n{r.stderr}'
    assert not (src / 'dpm' / 'assets' / 'models').exists()     # an editable install copies nothing
    return venv / 'bin', src


@pytest.mark.parametrize('doc', ['README.md', 'nbs/using_dpm.md'])
def test_readme_and_manual_commands_run_from_an_editable_install(editable, tmp_path, doc):
    """Every command of the document's ```bash blocks, as written (but -n 2 samples, the small
    configuration for training), in a user's folder outside the checkout: exit 0, no `dpm:` line.
    Build commands (bash tools/..., pip, jupyter), a GPU's commands and those on the reader's own
    files (--data, and the runs trained on them) are not run here."""
    bin_dir, src = editable
    env = {k: v for k, v in ENV.items() if k not in ('PYTHONPATH', 'DPM_ROOT')}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", DPM_SMALL='1')
    old = torch.load(ROOT / 'results' / 'models' / 'swiss_roll.pt', weights_only=True)
    del old['checksum']; old['format'] = 'dpm-checkpoint-1'       # the file `dpm upgrade` names
    (tmp_path / 'results' / 'models').mkdir(parents=True)
    torch.save(old, tmp_path / 'results' / 'models' / 'old.pt')
    ran = []
    for cmd in bash_commands(ROOT / doc):
        if BUILD.match(cmd) or GPU.search(cmd) or OWN.search(cmd): continue
        cmd = re.sub(r'(^| )-n [0-9]+', r'\1-n 2', cmd)
        r = subprocess.run(['bash', '-c', cmd], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, f'{cmd}:\n{r.stdout}\n{r.stderr}'
        assert not any(l.startswith('dpm:') for l in r.stderr.splitlines()), (cmd, r.stderr)
        ran.append(cmd)
    assert any(c.startswith('dpm sample mnist ') for c in ran), ran
    where = subprocess.run([str(bin_dir / 'python'), '-c', 'import dpm; print(dpm.__file__)'],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert Path(where.stdout.strip()).is_relative_to(src), where.stdout + where.stderr


# 2. notices are not errors -------------------------------------------------------------------------
def test_a_notice_and_a_refusal_give_one_dpm_line(tmp_path):
    out = tmp_path / 'D'
    r = dpm('sample', 'mnist_gpu', '--out', str(out), '-n', '1000000000')
    refused(r, '-n 1000000000', 'at most')
    assert 'using the model shipped' in r.stdout and tree(out) == {}


def test_a_successful_fallback_has_no_dpm_line(tmp_path):
    r = dpm('sample', 'swiss_roll', '--out', str(tmp_path / 'sr'), '-n', '5')
    assert r.returncode == 0, r.stderr
    assert 'using the model shipped' in r.stdout and 'dpm:' not in r.stderr, r.stderr


# 10, 11. leftovers: internal exception text, protocol-2 zero rows, closed stdout, digits, upgrade --
INTERNAL = re.compile(r'Error\b|<_io|\bname=\d|DOS at')


def test_a_zero_row_protocol_2_batch_is_refused_for_its_rows(tmp_path):
    d = cifar_dir(tmp_path)
    empty = {b'batch_label': b'x', b'data': np.zeros((0, 3072), np.uint8), b'labels': []}
    (d / 'data_batch_1').write_bytes(pickle.dumps(empty, protocol=2))
    before = tree(tmp_path)
    r = dpm('train', 'cifar10', '--out', str(tmp_path / 'o'), '--no-progress',
            env={'DPM_DATA': str(tmp_path)})
    err = one_line(r, 'data_batch_1', 'N >= 1', code=1)
    assert 'unpickle' not in err and tree(d) == {k[len('cifar-10-batches-py/'):]: v
                                                 for k, v in before.items()}


@pytest.mark.parametrize('content', [b'', b'\x80\x04garbage' * 50, b'\x80\x02]q\x00h\xd2\x00\x00\x00'])
def test_cifar_refusals_carry_no_internal_text(tmp_path, content):
    from dpm.readers import read_cifar_batch
    from dpm.settings import DataError
    (tmp_path / 'b').write_bytes(content)
    with pytest.raises(DataError) as e: read_cifar_batch(tmp_path / 'b')
    assert 'not a readable CIFAR-10 batch' in str(e.value) and not INTERNAL.search(str(e.value)), e.value


def test_jpeg_refusals_carry_no_internal_text(tmp_path):
    from PIL import Image
    from dpm.readers import read_grey_jpeg
    from dpm.settings import DataError
    (tmp_path / 'png.jpg').write_bytes(b'\x89PNG\r\n\x1a\n' + b'\0' * 200)    # not a JPEG at all
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / 'a.jpg')
    (tmp_path / 'cut.jpg').write_bytes((tmp_path / 'a.jpg').read_bytes()[:120])
    big = Image.new('L', (2, 2)); big.save(tmp_path / 'bomb.jpg')
    raw = bytearray((tmp_path / 'bomb.jpg').read_bytes())
    i = raw.index(b'\xff\xc0') + 5                                 # SOF0: height, width
    raw[i:i + 4] = (30000).to_bytes(2, 'big') * 2; (tmp_path / 'bomb.jpg').write_bytes(bytes(raw))
    for name, words in [('png.jpg', 'not a JPEG'), ('cut.jpg', 'not a readable JPEG'),
                        ('bomb.jpg', 'refusing to decode')]:
        with pytest.raises(DataError) as e: read_grey_jpeg(tmp_path / name, max_pixels=1 << 40)
        assert words in str(e.value) and not INTERNAL.search(str(e.value)), e.value


def test_list_with_standard_output_closed_fails(tmp_path):
    r = subprocess.run(['bash', '-c', f'"{sys.executable}" -m dpm list >&-'], capture_output=True,
                       text=True, cwd=ROOT, env=ENV, timeout=120)
    refused(r, 'standard output is closed')


@pytest.mark.parametrize('n', ['٣', '３', '1e3', '²'])
def test_only_ascii_digits_count(tmp_path, n):
    r = dpm('sample', 'swiss_roll', '--out', str(tmp_path / 'o'), '-n', n)
    refused(r, '-n')
    assert r.returncode == 2 and not (tmp_path / 'o').exists()


@pytest.mark.skipif(os.geteuid() == 0, reason='root writes into read-only folders')
def test_upgrade_in_a_read_only_folder_names_the_folder(tmp_path):
    old = torch.load(ROOT / 'results' / 'models' / 'swiss_roll.pt', weights_only=True)
    del old['checksum']; old['format'] = 'dpm-checkpoint-1'
    ro = tmp_path / 'ro'; ro.mkdir(); torch.save(old, ro / 'old.pt')
    before = tree(ro); ro.chmod(0o555)
    try: err = refused(dpm('upgrade', str(ro / 'old.pt')), str(ro), 'intact')
    finally: ro.chmod(0o755)
    assert '.dpm.tmp' not in err and tree(ro) == before


def test_a_folder_that_refuses_new_files_is_named(tmp_path, monkeypatch):
    "As above, where the tests run as root: the temporary file cannot be created (EACCES)."
    import tempfile
    from dpm.cli import main
    from hostile_helpers import exits
    old = torch.load(ROOT / 'results' / 'models' / 'swiss_roll.pt', weights_only=True)
    del old['checksum']; old['format'] = 'dpm-checkpoint-1'
    torch.save(old, tmp_path / 'old.pt'); before = tree(tmp_path)
    def refuse(*a, dir=None, **k): raise PermissionError(13, 'Permission denied', f'{dir}/old.pt.1.x.dpm.tmp')
    monkeypatch.setattr(tempfile, 'mkstemp', refuse)
    msg = exits(lambda: main(['upgrade', str(tmp_path / 'old.pt')]), str(tmp_path), 'intact')
    assert '.dpm.tmp' not in msg and tree(tmp_path) == before


def test_an_unexpanded_glob_is_named_missing(tmp_path):
    target = tmp_path / 'model.pt'; target.write_bytes(b'before')
    r = script(WEIGHTS, 'unpack', target, tmp_path / 'nothing' / 'x_gpu.bf16.*.pt')
    refused(r, 'no such shard', 'pattern', prefix='weights.py: ')
    assert target.read_bytes() == b'before'


# 3, 4, 5. verify before replacing ------------------------------------------------------------------
@pytest.fixture(scope='module')
def packs(tmp_path_factory):
    """Packs (bench/weights.py) of a small trained swiss roll: its model file and its training
    state, both named as if they were dead_leaves_gpu's; and dead_leaves_gpu's committed pack."""
    w = tmp_path_factory.mktemp('packs')
    r = dpm('train', 'swiss_roll', '--out', str(w / 'run'), *QUICK)
    assert r.returncode == 0, r.stderr
    from dpm.checkpoints import pack_shards
    model = pack_shards(w / 'run' / 'model.pt', w / 'foreign', 'dead_leaves_gpu')
    state = pack_shards(w / 'run' / 'checkpoint.pt', w / 'foreign', 'dead_leaves_gpu.state')
    good = sorted((ROOT / 'results' / 'dead_leaves_gpu' / 'weights').glob('dead_leaves_gpu.bf16.*.pt'))
    return dict(model=model, state=state, good=good, run=w / 'run')


def test_unpack_of_a_state_pack_keeps_the_target(packs, tmp_path):
    target = tmp_path / 'model.pt'; shutil.copy(packs['run'] / 'model.pt', target)
    before = target.read_bytes()
    refused(script(WEIGHTS, 'unpack', target, *packs['state']), 'training checkpoint', 'resume',
            prefix='weights.py: ')
    assert target.read_bytes() == before and tree(tmp_path) == {'model.pt': tree(tmp_path)['model.pt']}


def test_resume_refuses_a_foreign_state_pack(packs, tmp_path):
    target = tmp_path / 'w' / 'checkpoint.pt'
    refused(script(WEIGHTS, 'resume', '--experiment', 'dead_leaves_gpu', target, *packs['state']),
            'another experiment', 'bound_samples', 'foreign', prefix='weights.py: ')
    refused(script(WEIGHTS, 'unpack', '--experiment', 'dead_leaves_gpu', target, *packs['model']),
            "'swiss_roll'", 'foreign', prefix='weights.py: ')
    assert not (tmp_path / 'w').exists()
    campaign = (ROOT / 'bench' / 'gpu_campaign.sh').read_text()     # the campaign asks for its own
    assert 'weights.py resume --experiment "$n"' in campaign
    assert 'weights.py unpack --experiment "$n"' in campaign


@pytest.mark.parametrize('restarts', [5, '[]', 'x', {'a': 1}, [1]])
def test_summary_of_a_bad_record_is_one_line(tmp_path, restarts):
    rec = dict(steps=10, train_seconds=60.0, restarts=restarts, device='cpu')
    (tmp_path / 'training.json').write_text(json.dumps(rec))
    refused(script(WEIGHTS, 'summary', tmp_path / 'training.json'), 'not a training record',
            prefix='weights.py: ')


def test_summary_of_no_restarts(tmp_path):
    (tmp_path / 'training.json').write_text(json.dumps(dict(steps=10, train_seconds=60.0, restarts=[])))
    r = script(WEIGHTS, 'summary', tmp_path / 'training.json')
    assert r.returncode == 0 and '1 run(s)' in r.stdout, r.stdout + r.stderr


def campaign_root(tmp_path) -> Path:
    "A copy of the repository's campaign scripts over the real package, its results/ its own."
    root = tmp_path / 'repo'
    (root / 'bench').mkdir(parents=True)
    for name in ['gpu_campaign.sh', 'weights.py']: shutil.copy2(ROOT / 'bench' / name, root / 'bench')
    (root / 'dpm').symlink_to(ROOT / 'dpm')
    shutil.copytree(ROOT / 'results' / 'dead_leaves_gpu', root / 'results' / 'dead_leaves_gpu')
    return root


@pytest.mark.parametrize('how', ['truncated', 'empty', 'renamed', 'foreign'])
def test_install_only_refuses_bad_shards_and_keeps_the_pack(packs, tmp_path, how):
    root, out = campaign_root(tmp_path), tmp_path / 'OUT'
    paper = tmp_path / 'rec' / 'paper' / 'dead_leaves_gpu'; paper.mkdir(parents=True)
    for f in ['record.json', 'training.json']:
        shutil.copy2(root / 'results' / 'dead_leaves_gpu' / f, paper / f)
    (tmp_path / 'rec' / 'logs').mkdir(); (tmp_path / 'rec' / 'logs' / 'campaign.log').write_text('x\n')
    (out / 'paper').mkdir(parents=True)
    with tarfile.open(out / 'records.tgz', 'w:gz') as t:
        for p in ['paper', 'logs']: t.add(tmp_path / 'rec' / p, arcname=p)
    good = packs['good'][0].read_bytes()
    shard = out / 'paper' / 'dead_leaves_gpu.bf16.00.pt'
    if how == 'truncated': shard.write_bytes(good[:len(good) // 2])
    elif how == 'empty': shard.write_bytes(b'')
    elif how == 'renamed':
        shutil.copy(ROOT / 'results' / 'mnist_gpu' / 'weights' / 'mnist_gpu.bf16.00.pt', shard)
    else: shutil.copy(packs['model'][0], shard)
    before = tree(root / 'results')
    r = subprocess.run(['bash', str(root / 'bench' / 'gpu_campaign.sh')], capture_output=True,
                       text=True, env={**ENV, 'INSTALL_ONLY': '1', 'OUT': str(out)}, timeout=300)
    assert r.returncode != 0, r.stdout + r.stderr
    assert 'left as it was' in r.stdout, r.stdout
    assert tree(root / 'results' / 'dead_leaves_gpu') == {k[len('dead_leaves_gpu/'):]: v
                                                          for k, v in before.items()}


# 8. signals -----------------------------------------------------------------------------------------
def started(cmd, ready: str, cwd, env=None, limit=180):
    "A `dpm` process started, once its standard output has shown `ready`: (process, its stdout)."
    p = subprocess.Popen([sys.executable, '-c', cmd], cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env={**ENV, 'PYTHONUNBUFFERED': '1', **(env or {})})
    seen, t0 = '', time.time()
    while ready not in seen:
        line = p.stdout.readline()
        assert line or p.poll() is None, (seen, p.stderr.read())
        seen += line
        assert time.time() - t0 < limit, seen
    return p, seen


@pytest.mark.parametrize('sig, code', [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_sigterm_ends_training_as_sigint_does(tmp_path, sig, code):
    out = tmp_path / 'run'
    cmd = 'from dpm.cli import main; main()'
    argv = ['train', 'swiss_roll', '--out', str(out), '--no-progress', '--set', 'steps=10000000',
            '--set', 'checkpoint_every=50', '--set', 'eval_every=0']
    p, seen = started(f"import sys; sys.argv[1:] = {argv!r}; " + cmd, 'data:', ROOT)
    for _ in range(600):                                 # a checkpoint written: a step to resume
        if (out / 'checkpoint.pt').exists(): break
        time.sleep(0.1)
    time.sleep(0.5)
    p.send_signal(sig)
    try: rest, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired: p.kill(); raise AssertionError(f'{sig!r} not honoured in 60 s')
    assert p.returncode == code, (p.returncode, err)
    err = err.strip()
    assert len(err.splitlines()) == 1 and err.startswith('dpm: interrupted; ') and 'resume' in err, err
    from dpm.training import load_checkpoint
    assert load_checkpoint(out / 'checkpoint.pt')['step'] > 0


def test_a_swallowed_interrupt_is_raised_again(tmp_path):
    """An interrupt that a finaliser or a library swallows (here: a command that catches it once and
    goes on) is raised again within seconds: the run still ends in one line."""
    cmd = ('import time, dpm.cli as c\n'
           'def stubborn(args):\n'
           '    try: print("ready", flush=True); time.sleep(60)\n'   # the signal lands in the try
           '    except KeyboardInterrupt: print("swallowed", flush=True)\n'
           '    while True: time.sleep(0.05)\n'
           'c.cmd_list = stubborn\n'
           'c.main(["list"])\n')
    p, _ = started(cmd, 'ready', ROOT)
    t0 = time.time(); p.send_signal(signal.SIGINT)
    try: out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired: p.kill(); raise AssertionError('the interrupt stayed lost')
    assert 'swallowed' in out and p.returncode == 130 and err.strip() == 'dpm: interrupted', (out, err)
    assert time.time() - t0 < 15


# 9. campaign locks that name their owner ------------------------------------------------------------
def factorial_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location('campaign_locks', ROOT / 'bench' / 'campaign_locks.py')
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m


def gone_pid() -> int:
    "The id of a process that has ended."
    p = subprocess.Popen([sys.executable, '-c', 'pass']); p.wait()
    return p.pid


def test_a_lock_names_its_owner_and_a_dead_one_is_taken_over(tmp_path):
    import platform
    sf = factorial_module()
    lock = tmp_path / '.x.lock'
    said = []
    assert sf.claim(lock, say=lambda *a, **k: said.append(a[0]))
    assert lock.read_text() == f'pid {os.getpid()} on {platform.node()}\n' and not said
    assert not sf.claim(lock, say=lambda *a, **k: said.append(a[0]))     # a running owner: kept
    dead = gone_pid()
    lock.write_text(f'pid {dead} on {platform.node()}\n')
    assert sf.claim(lock, say=lambda *a, **k: said.append(a[0]))
    assert said == [f'.x.lock: its worker (pid {dead} on {platform.node()}) is gone: taking the job over']
    assert lock.read_text().startswith(f'pid {os.getpid()} ')
    lock.write_text(f'pid {dead} on another-host\n')                   # cannot be told: kept
    assert not sf.claim(lock, say=said.append) and len(said) == 1


def test_list_and_worker_name_the_locked_jobs(tmp_path):
    import importlib.util, platform
    spec = importlib.util.spec_from_file_location('successors_factorial',
                                                  ROOT / 'bench' / 'successors_factorial.py')
    sfm = importlib.util.module_from_spec(spec); spec.loader.exec_module(sfm)
    todo = [j for j in sfm.jobs([0]) if j[0] == 'swiss_roll']
    names = [f'{d}-{c}-{s}-seed{seed}' for d, c, s, seed, _, _ in todo]
    for (*_, kind), n in list(zip(todo, names))[2:]:                          # done
        done = sfm.supplement_path(tmp_path, n) if kind == 'resample' else tmp_path / f'{n}.json'
        done.parent.mkdir(exist_ok=True); done.write_text('{}')
    kinds = [job[-1] for job in todo]
    (tmp_path / f'.{kinds[0]}-{names[0]}.lock').write_text(f'pid {os.getpid()} on {platform.node()}\n')
    (tmp_path / f'.{kinds[1]}-{names[1]}.lock').write_text('')             # an old lock: no owner
    args = ['--out', tmp_path, '--seeds', '0', '--data', 'swiss_roll']
    r = script(ROOT / 'bench' / 'successors_factorial.py', *args, '--list')
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(names[0].split('-')[1] in l and f'locked by pid {os.getpid()}' in l and 'running' in l
               for l in lines), r.stdout
    assert sum('no owner named' in l for l in lines) == 1, r.stdout
    before = tree(tmp_path)
    r = script(ROOT / 'bench' / 'successors_factorial.py', *args, '--worker')
    assert r.returncode == 0, r.stderr
    assert f'skipped {names[0]}' in r.stdout and f'skipped {names[1]}' in r.stdout, r.stdout
    assert tree(tmp_path) == before                                          # nothing run, nothing lost


# 7. a lost peer under torchrun (gloo, CPU) -----------------------------------------------------------
def rank_pids(agent: int) -> dict:
    "RANK -> pid of the worker processes under a torchrun agent (read from /proc)."
    from dpm.cli import _torchrun_ranks
    return _torchrun_ranks(agent)


@pytest.mark.skipif(not torch.distributed.is_available() or not Path('/proc/self/environ').exists(),
                    reason='torch.distributed or /proc missing')
@pytest.mark.parametrize('victim', [0, 1])
def test_a_lost_peer_is_one_line_naming_it(tmp_path, victim):
    """kill -9 of one of two processes: the other ends within 60 s with one `dpm:` line naming the
    lost rank and the step its checkpoint holds; no traceback through dpm's code."""
    out = tmp_path / 'run'
    p = subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                          '--nproc_per_node=2', '-m', 'dpm', 'train', 'swiss_roll', '--small',
                          '--set', 'steps=100000000', '--set', 'T=10', '--set', 'eval_every=0',
                          '--set', 'checkpoint_every=50', '--no-progress', '--out', str(out)],
                         cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1800):
            if (out / 'checkpoint.pt').exists(): break
            time.sleep(0.1)
        pids = rank_pids(p.pid)
        assert set(pids) == {0, 1}, pids
        os.kill(pids[victim], signal.SIGKILL)
        t0 = time.time()
        _, err = p.communicate(timeout=60)
    finally:                    # the ranks run in sessions of their own: a failed test stops them too
        if p.poll() is None:
            ranks = rank_pids(p.pid)
            p.kill()
            for pid in ranks.values():
                try: os.kill(pid, signal.SIGKILL)
                except ProcessLookupError: pass
    assert p.returncode != 0 and time.time() - t0 < 60
    lines = [l for l in err.splitlines() if 'dpm: ' in l]
    assert len(lines) == 1, err[-3000:]
    assert f'rank {victim} of the 2 processes was lost' in lines[0] and 'holds step' in lines[0], lines
    assert 'dpm/' not in err and '[rank' not in err, err[-3000:]        # no traceback of ours
    from dpm.training import load_checkpoint
    step = int(re.search(r'holds step (\d+)', lines[0])[1])
    assert load_checkpoint(out / 'checkpoint.pt')['step'] == step > 0



AGENT = """
import os, subprocess, sys, time
env = dict(os.environ, TORCHELASTIC_RUN_ID='test-run', WORLD_SIZE='2')
rank0 = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env=dict(env, RANK='0'))
look = ('import sys, time, dpm.cli as c; print(c._absent_ranks(), flush=True); sys.stdin.readline(); '
        'print(c._absent_ranks(), flush=True)')
rank1 = subprocess.Popen([sys.executable, '-c', look], env=dict(env, RANK='1'), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
print(rank1.stdout.readline().strip(), flush=True)
rank0.kill(); rank0.wait()                      # lost and reaped, as torchrun's agent does
rank1.stdin.write('go\\n'); rank1.stdin.flush()
print(rank1.stdout.readline().strip(), flush=True); rank1.wait()
"""


@pytest.mark.skipif(not Path('/proc/self/environ').exists(), reason='/proc missing')
def test_a_sigterm_before_the_collective_fails_still_names_the_lost_rank():
    """torchrun's SIGTERM can reach the survivor before its collective fails: the survivor then finds
    the lost rank by looking for its peers under the same agent."""
    r = subprocess.run([sys.executable, '-c', AGENT], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split('\n')[:2] == ['[]', '[0]'], r.stdout

# 6. records carry a checksum and a schema ------------------------------------------------------------
STUDY = ROOT / 'results' / 'successors' / 'study'


def tampered_records():
    "(name, how a committed record is changed): plausible edits and damage."
    from dpm.factorial import pack_values, unpack_values
    def shift(r):                                  # every per-example K + 0.5: a plausible edit
        ex = r['scores']['as_specified']['examples']
        ex['K'] = pack_values(unpack_values(ex['K']) + 0.5)
    def nan_k(r):
        ex = r['scores']['as_specified']['examples']
        ex['K'] = pack_values(unpack_values(ex['K']) * float('nan'))
    return [('K + 0.5', shift), ('NaN per-example K', nan_k),
            ('seed "3"', lambda r: r.update(seed='3')), ('samples []', lambda r: r.update(samples=[])),
            ('no curve', lambda r: r.pop('curve')),
            ('K_bits NaN', lambda r: r['scores']['as_specified'].update(K_bits=float('nan'))),
            ('complete "yes"', lambda r: r.update(complete='yes'))]


@pytest.mark.parametrize('resign', [False, True])
@pytest.mark.parametrize('how', range(7))
def test_a_tampered_study_record_is_refused_naming_the_file(tmp_path, how, resign):
    """A committed study record, signed with tools/record_checksums.py in a scratch folder, then
    edited: refused by its checksum; edited and signed again (the checksum recomputed), the edits
    that break the schema are still refused, naming the file."""
    from dpm.readers import RecordError, read_study_record, signed
    name, change = tampered_records()[how]
    src = sorted(STUDY.glob('mnist-eps-tilde-K-linear-seed*.json'))[0]
    shutil.copy(src, tmp_path / src.name)
    r = script(ROOT / 'tools' / 'record_checksums.py', tmp_path)
    assert r.returncode == 0 and ('1 signed' in r.stdout or '1 ok' in r.stdout), r.stdout + r.stderr
    good = read_study_record(tmp_path / src.name)
    rec = json.loads(json.dumps(good)); change(rec)
    if resign: rec = signed(rec)
    (tmp_path / src.name).write_text(json.dumps(rec))
    if resign and name in ('K + 0.5', 'NaN per-example K'):
        assert read_study_record(tmp_path / src.name)       # signed by the editor: the sum cannot tell
        return
    with pytest.raises(RecordError) as e: read_study_record(tmp_path / src.name)
    assert str(tmp_path / src.name) in str(e.value), e.value
    r = script(ROOT / 'tools' / 'record_checksums.py', '--check', tmp_path)
    assert r.returncode == 1 and src.name in r.stderr, r.stdout + r.stderr


def test_signing_keeps_every_value_and_refuses_a_mismatch(tmp_path):
    from dpm.readers import read_floors, read_record
    for p in [STUDY / 'floors.json', *sorted(STUDY.glob('swiss_roll-*-jump-seed0.json'))]:
        shutil.copy(p, tmp_path / p.name)
    before = {p.name: {k: v for k, v in json.loads(p.read_text()).items() if k != 'sha256'}
              for p in tmp_path.iterdir()}                  # committed records carry one already
    r = script(ROOT / 'tools' / 'record_checksums.py', tmp_path)
    assert r.returncode == 0, r.stderr
    for p in tmp_path.iterdir():
        after = read_record(p); after.pop('sha256')
        assert after == before[p.name], p.name                    # the values, unchanged
    assert set(read_floors(tmp_path / 'floors.json', ['swiss_roll', 'mnist'])) >= {'swiss_roll', 'mnist'}
    snap = tree(tmp_path)
    assert script(ROOT / 'tools' / 'record_checksums.py', '--check', tmp_path).returncode == 0
    f = tmp_path / 'floors.json'; f.write_text(f.read_text().replace('"n":2000', '"n":2001', 1))
    r = script(ROOT / 'tools' / 'record_checksums.py', tmp_path)   # a mismatch is never re-signed
    assert r.returncode == 1 and 'floors.json' in r.stderr and 'does not match' in r.stderr
    assert {k: v for k, v in tree(tmp_path).items() if k != 'floors.json'} == \
        {k: v for k, v in snap.items() if k != 'floors.json'}


def test_an_evaluation_record_is_recomputed_when_it_fails_saying_so(tmp_path, capsys):
    from dpm.experiments import recorded_study, write_study
    calls = []
    run = lambda: calls.append(1) or dict(K_bits=-1.25, K_bits_se=0.01)
    recorded_study(tmp_path / 'e.pt', 'k', run)
    good = torch.load(tmp_path / 'e.pt', weights_only=True)
    for change, words in [(dict(K_bits=-0.75), 'does not match its sha256'),
                          (dict(machine='a string'), "'machine'"),
                          ({'sha256': None}, 'no checksum')]:
        torch.save({**good, **change}, tmp_path / 'e.pt')
        capsys.readouterr()
        study, where = recorded_study(tmp_path / 'e.pt', 'k', run)
        err = capsys.readouterr().err.strip()
        assert not where['read'] and study['K_bits'] == -1.25, study
        assert len(err.splitlines()) == 1 and str(tmp_path / 'e.pt') in err and words in err, err
        assert 'computing it anew' in err
    write_study(tmp_path / 'e.pt', 'k', dict(K_bits=float('nan'), K_bits_se=float('nan')))
    study, where = recorded_study(tmp_path / 'e.pt', 'k', run)       # all NaN, yet signed: refused
    assert not where['read'] and study['K_bits'] == -1.25 and 'NaN' in capsys.readouterr().err
    assert len(calls) == 5
