"""The book's execution cache (tools/execute_book.py, run by tools/book.sh), checked without
building the book: one cache per scale, a stamp that clears it when the package, the committed
results or the figure-font hook change, and cache keys that are the ones myst-nb's `cache` mode
matches when it reads a chapter (after tools/nbdev_directives.py has translated it)."""
import copy
import importlib.util
import json
import re
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location('execute_book', ROOT / 'tools' / 'execute_book.py')
execute_book = importlib.util.module_from_spec(spec)
spec.loader.exec_module(execute_book)


@pytest.mark.parametrize('value', ['', '0', '1', 'false', 'no', 'yes', 'True', ' 0 ', 'NO'])
def test_scale_is_read_as_the_package_reads_it(value, monkeypatch):
    from dpm.config import small_scale
    monkeypatch.setenv('DPM_SMALL', value)
    assert execute_book.small_scale({'DPM_SMALL': value}) == small_scale()
    assert execute_book.scale_name({'DPM_SMALL': value}) == ('small' if small_scale() else 'full')


def test_each_scale_has_its_own_cache(tmp_path):
    small = execute_book.cache_dir(tmp_path, {'DPM_SMALL': '1'})
    full = execute_book.cache_dir(tmp_path, {})
    assert small != full and small.name == 'small' and full.name == 'full'
    assert execute_book.cache_dir(tmp_path, {'DPM_SMALL': '0'}) == full
    # a chapter executed at one scale is not found in the other scale's cache
    from jupyter_cache import get_cache
    nb = execute_book.as_the_book_reads(ROOT / 'nbs' / 'index.ipynb')
    execute_book.store(get_cache(str(small / 'jupyter_cache')), nb, executed(nb), 'index', 1.0)
    get_cache(str(small / 'jupyter_cache')).match_cache_notebook(nb)
    with pytest.raises(KeyError):
        get_cache(str(full / 'jupyter_cache')).match_cache_notebook(nb)


def fake_root(tmp_path):
    for rel, text in {'dpm/core.py': 'x = 1\n', 'dpm/data/mnist.npz': 'data', 'results/a/record.json': '{}',
                      'results/models/m.pt': 'weights', 'tools/figure_fonts.py': 'MIN_PT = 8\n',
                      'tools/nbdev_directives.py': '', 'tools/requirements.lock': 'torch==2\n',
                      'settings.ini': ''}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


@pytest.mark.parametrize('changed, key', [('dpm/core.py', 'dpm'), ('dpm/data/mnist.npz', 'dpm'),
                                          ('results/a/record.json', 'results'),
                                          ('results/models/m.pt', 'results'),
                                          ('results/new/record.json', 'results'),
                                          ('tools/figure_fonts.py', 'tools/figure_fonts.py'),
                                          ('tools/requirements.lock', 'tools/requirements.lock')])
def test_stamp_sees_what_outputs_depend_on(tmp_path, changed, key):
    root = fake_root(tmp_path)
    before = execute_book.stamp(root, {})
    (root / changed).parent.mkdir(parents=True, exist_ok=True)
    (root / changed).write_text('changed')
    after = execute_book.stamp(root, {})
    assert [k for k in after if after[k] != before[k]] == [key]


def test_stamp_ignores_bytecode_and_names_the_data_root(tmp_path):
    root = fake_root(tmp_path)
    before = execute_book.stamp(root, {})
    (root / 'dpm' / '__pycache__').mkdir()
    (root / 'dpm' / '__pycache__' / 'core.cpython-311.pyc').write_bytes(b'\0')
    assert execute_book.stamp(root, {}) == before
    assert execute_book.stamp(root, {'DPM_DATA': '/data'})['DPM_DATA'] == '/data'
    assert execute_book.stamp(root, {'DPM_SMALL': '1'})['scale'] == 'small'


def test_a_changed_stamp_clears_the_cache(tmp_path):
    root = fake_root(tmp_path)
    cache = execute_book.cache_dir(root, {'DPM_SMALL': '1'})
    first = execute_book.stamp(root, {'DPM_SMALL': '1'})
    assert execute_book.prepare_cache(cache, first) == []              # new: nothing to clear
    (cache / 'kept').write_text('an execution')
    assert execute_book.prepare_cache(cache, first) == [] and (cache / 'kept').exists()
    (root / 'dpm' / 'core.py').write_text('x = 2\n')
    second = execute_book.stamp(root, {'DPM_SMALL': '1'})
    assert execute_book.prepare_cache(cache, second) == ['dpm']
    assert not (cache / 'kept').exists()
    assert json.loads((cache / 'stamp.json').read_text()) == second
    (cache / 'kept').write_text('an execution')
    assert execute_book.prepare_cache(cache, second, force=True) == ['--force']
    assert not (cache / 'kept').exists()
    # a cache without a stamp (written by something else) is not trusted
    (cache / 'stamp.json').unlink(); (cache / 'kept').write_text('?')
    assert execute_book.prepare_cache(cache, second) == ['no cache yet'] and not (cache / 'kept').exists()


def executed(nb):
    """`nb` as a kernel leaves it: outputs, execution counts and nbclient's cell metadata."""
    out = copy.deepcopy(nb)
    n = 0
    for cell in out.cells:
        if cell.cell_type != 'code': continue
        n += 1
        cell.execution_count = n
        cell.outputs = [nbformat.v4.new_output('stream', name='stdout', text=f'cell {n}\n')]
        cell.metadata['execution'] = {'iopub.status.idle': '2026-01-01T00:00:00Z'}
    return out


class _Env:
    def doc2path(self, docname): return ROOT / f'{docname}.ipynb'


class _App:
    env = _Env()


def as_myst_nb_reads(nb_path):
    """What myst-nb's `cache` mode matches: the source after the Sphinx `source-read` event of
    tools/nbdev_directives.py, read by myst-nb's own reader."""
    from myst_nb.core.read import standard_nb_read
    spec = importlib.util.spec_from_file_location('nbdev_directives', ROOT / 'tools' / 'nbdev_directives.py')
    nbdev_directives = importlib.util.module_from_spec(spec); spec.loader.exec_module(nbdev_directives)
    source = [nb_path.read_text(encoding='utf-8')]
    nbdev_directives.on_source_read(_App(), f'nbs/{nb_path.stem}', source)
    return standard_nb_read(source[0])


@pytest.mark.parametrize('nb_path', execute_book.chapters(ROOT), ids=lambda p: p.stem)
def test_cached_chapter_is_what_myst_nb_finds(nb_path, tmp_path):
    from jupyter_cache import get_cache
    cache = get_cache(str(tmp_path / 'jupyter_cache'))
    ours = execute_book.as_the_book_reads(nb_path)
    theirs = as_myst_nb_reads(nb_path)
    assert execute_book.notebook_key(cache, ours) == execute_book.notebook_key(cache, theirs)
    execute_book.store(cache, ours, executed(ours), str(nb_path), 1.0)
    _, merged = cache.merge_match_into_notebook(theirs)
    outs = [c.outputs for c in merged.cells if c.cell_type == 'code']
    assert outs and all(o[0]['text'] == f'cell {i}\n' for i, o in enumerate(outs, 1))
    # cached, but not valid for the book until its figure-font records are complete
    records = tmp_path / 'figure_fonts'
    assert not execute_book.is_cached(cache, ours, records)
    (records / execute_book.notebook_key(cache, ours)).mkdir(parents=True)
    (records / execute_book.notebook_key(cache, ours) / execute_book.COMPLETE).touch()
    assert execute_book.is_cached(cache, ours, records)


def test_key_follows_code_not_prose(tmp_path):
    from jupyter_cache import get_cache
    cache = get_cache(str(tmp_path / 'jupyter_cache'))
    src = json.loads((ROOT / 'nbs' / '03_entropy.ipynb').read_text())
    key = lambda nb: execute_book.notebook_key(cache, execute_book.as_the_book_reads(write(nb)))
    def write(nb):
        p = tmp_path / 'x.ipynb'; p.write_text(json.dumps(nb)); return p
    base = key(src)
    prose = copy.deepcopy(src)
    next(c for c in prose['cells'] if c['cell_type'] == 'markdown')['source'] += '\nMore words.'
    assert key(prose) == base
    code = copy.deepcopy(src)
    next(c for c in code['cells'] if c['cell_type'] == 'code')['source'] += '\nx = 1'
    assert key(code) != base


def test_budget_table_names_chapters():
    budgets = execute_book.read_budgets()
    stems = {p.stem for p in execute_book.chapters(ROOT)}
    assert not set(budgets) - stems - {'*'}, f'budgets for no chapter: {set(budgets) - stems - {"*"}}'
    assert all(b['small'] > 0 and b['full'] > 0 for b in budgets.values())
    assert execute_book.budget(budgets, 'no_such_chapter', 'full') == budgets['*']['full']


def test_cached_build_config_and_the_from_scratch_ci_build(tmp_path):
    base = yaml.safe_load((ROOT / '_config.yml').read_text())
    cfg = execute_book.cache_config(ROOT, tmp_path)
    assert cfg['execute']['execute_notebooks'] == 'cache' and cfg['execute']['cache'] == str(tmp_path)
    for name, where in cfg['sphinx']['local_extensions'].items():
        assert Path(where).is_absolute() and (Path(where) / f'{name}.py').exists()
    rest = lambda c: {k: v for k, v in c.items() if k not in ('execute', 'sphinx')}
    assert rest(cfg) == rest(base)
    assert cfg['sphinx']['config'] == base['sphinx']['config']
    # CI (tools/test.sh) builds from scratch: jupyter-book's own `force` execution, no cache
    assert base['execute']['execute_notebooks'] == 'force'
    assert re.search(r'^DPM_BOOK_CACHE=0 bash "\$\(dirname "\$0"\)/book\.sh"', (ROOT / 'tools' / 'test.sh').read_text(), re.M)
    book = (ROOT / 'tools' / 'book.sh').read_text()
    assert '--all --warningiserror' in book and 'unset MPLBACKEND' in book
