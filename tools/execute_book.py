"""Execute the book's chapters before `jupyter-book build`: progress, a cache, two at a time.

tools/book.sh runs `python tools/execute_book.py` and then `jupyter-book build --config CONFIG`
with the configuration this writes (the book's _config.yml with `execute_notebooks: cache` and this
scale's cache). The steps:

1. The scale (DPM_SMALL, read as dpm.config reads it) picks the cache, `_build/.jupyter_cache/small`
   or `.../full`: a cache key is a notebook's code cells only, so each scale has a cache of its own.
2. A stamp beside the cache (`stamp.json`) hashes what a chapter's outputs depend on besides its
   code cells (`STAMP_INPUTS`: the package dpm/ with its data, the committed results/ and models,
   the figure-font hook, the book's cell translation, the locked toolchain, DPM_DATA). When it
   differs from the stamp the cache was filled under, the cache is cleared.
3. Every chapter of _toc.yml, translated as the book reads it (tools/nbdev_directives.py: `#|`
   directives become tags), is looked up in the jupyter-cache by its code cells (jupyter-cache's own
   hash, the one myst-nb's `cache` mode matches). A chapter that is there with its figure-font
   records is not executed again.
4. The others run, up to --jobs at a time, each in a kernel of --threads threads (OMP/MKL/torch),
   longest first (by their last times, else their budgets); each prints its name when it starts and
   its seconds when done, with a warning when it took longer than its budget
   (tools/book_budgets.tsv). A cell error stops the build (exit status 1).
5. Each kernel loads tools/figure_fonts.py from a profile of its own and writes its records into
   `figure_fonts/<cache key>/` beside the cache; the records of every chapter of the book are
   copied into --records (tests/test_book.py reads them there), executed now or before.

`--force` clears this scale's cache first (a from-scratch build; tools/test.sh instead builds with
jupyter-book's own `force` execution, DPM_BOOK_CACHE=0 in tools/book.sh).
"""
import argparse
import concurrent.futures
import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tools'))
import nbdev_directives  # noqa: E402  (tools/, the book's own Sphinx extension)

# What a chapter's outputs depend on besides its code cells: files or folders, relative to the root.
STAMP_INPUTS = ['dpm', 'results', 'tools/figure_fonts.py', 'tools/nbdev_directives.py',
                'tools/requirements.lock', 'settings.ini']
SKIP_PARTS = {'__pycache__', '.ipynb_checkpoints', 'screenshots'}   # screenshots: of the book
BUDGETS = ROOT / 'tools' / 'book_budgets.tsv'
COMPLETE = '.complete'          # written into a records folder once its chapter ran to the end


def small_scale(environ=os.environ) -> bool:
    """dpm.config.small_scale's reading of DPM_SMALL (not imported: this runs without torch)."""
    return environ.get('DPM_SMALL', '0').strip().lower() not in ('', '0', 'false', 'no')


def scale_name(environ=os.environ) -> str:
    return 'small' if small_scale(environ) else 'full'


def cache_dir(root=ROOT, environ=os.environ) -> Path:
    """This scale's cache: _build/.jupyter_cache/small or .../full."""
    return Path(root) / '_build' / '.jupyter_cache' / scale_name(environ)


def _files(path: Path):
    if path.is_file(): yield path
    elif path.is_dir():
        for p in sorted(path.rglob('*')):
            if p.is_file() and not SKIP_PARTS & set(p.parts) and p.suffix not in ('.pyc', '.pyo'):
                yield p


def stamp(root=ROOT, environ=os.environ) -> dict:
    """input -> sha256 of its files (relative names and contents), plus the scale and DPM_DATA."""
    root = Path(root)
    out = {'scale': scale_name(environ), 'DPM_DATA': environ.get('DPM_DATA', '')}
    for name in STAMP_INPUTS:
        h = hashlib.sha256()
        for p in _files(root / name):
            h.update(p.relative_to(root).as_posix().encode() + b'\0')
            h.update(hashlib.sha256(p.read_bytes()).digest())
        out[name] = h.hexdigest()
    return out


def prepare_cache(cache: Path, current: dict, force=False) -> list:
    """Clear `cache` when its stamp differs from `current` (or `force`); returns the reasons."""
    path = cache / 'stamp.json'
    old = json.loads(path.read_text()) if path.exists() else None
    if force: why = ['--force']
    elif old is None: why = ['no cache yet'] if cache.exists() and any(cache.iterdir()) else []
    else: why = [k for k in sorted(set(old) | set(current)) if old.get(k) != current.get(k)]
    if why and cache.exists(): shutil.rmtree(cache)
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(current, indent=1, sort_keys=True) + '\n')
    return why


def chapters(root=ROOT) -> list:
    """The notebooks of _toc.yml (`root:` and `- file:`), in reading order."""
    toc = (Path(root) / '_toc.yml').read_text()
    return [Path(root) / f'{m}.ipynb' for m in re.findall(r'(?:root|file):\s*(nbs/\S+)', toc)
            if (Path(root) / f'{m}.ipynb').exists()]


def as_the_book_reads(path: Path):
    """The notebook myst-nb executes: translated by nbdev_directives.on_source_read, then read by
    myst-nb's reader (nbformat, version 4)."""
    import nbformat
    nb = json.loads(Path(path).read_text(encoding='utf-8'))
    nb['cells'] = nbdev_directives.with_equation_links(nb['cells'])
    return nbformat.reads(json.dumps(nb), as_version=4)


def notebook_key(cache, nb) -> str:
    """jupyter-cache's hash of a notebook (code cells and their metadata, the kernelspec)."""
    return cache.create_hashed_notebook(nb)[1]


def is_cached(cache, nb, records_root: Path) -> bool:
    try: cache.match_cache_notebook(nb)
    except KeyError: return False
    return (records_root / notebook_key(cache, nb) / COMPLETE).exists()


def store(cache, source_nb, executed_nb, uri: str, seconds: float):
    """Put an executed notebook into the cache under the key of `source_nb` (its cell metadata,
    which the key hashes, restored: the kernel may add some)."""
    from jupyter_cache.base import CacheBundleIn
    executed_nb = copy.deepcopy(executed_nb)
    code = [c for c in source_nb.cells if c.cell_type == 'code']
    done = [c for c in executed_nb.cells if c.cell_type == 'code']
    assert len(code) == len(done), 'the executed notebook has other cells than its source'
    for src, out in zip(code, done): out.metadata = copy.deepcopy(src.metadata)
    cache.cache_notebook_bundle(CacheBundleIn(executed_nb, uri, data={'execution_seconds': seconds}),
                                check_validity=False, overwrite=True)
    assert notebook_key(cache, executed_nb) == notebook_key(cache, source_nb)


def read_budgets(path=BUDGETS) -> dict:
    """chapter -> {'small': s, 'full': s}; the row '*' is every other chapter's."""
    out = {}
    for line in Path(path).read_text().splitlines():
        line = line.split('#', 1)[0].strip()
        if not line: continue
        name, small, full = line.split()
        out[name] = {'small': float(small), 'full': float(full)}
    if '*' not in out: raise ValueError(f'{path}: no default row "*"')
    return out


def budget(budgets: dict, stem: str, scale: str) -> float:
    return budgets.get(stem, budgets['*'])[scale]


def cache_config(root: Path, cache: Path) -> dict:
    """The book's _config.yml, executing from `cache` (jupyter-book's `cache` mode); local Sphinx
    extensions by absolute path, since the file is written elsewhere."""
    import yaml
    cfg = yaml.safe_load((Path(root) / '_config.yml').read_text())
    cfg['execute'].update(execute_notebooks='cache', cache=str(cache))
    ext = cfg.get('sphinx', {}).get('local_extensions') or {}
    for name, where in ext.items(): ext[name] = str((Path(root) / where).resolve())
    return cfg


def run_one(src: str, out: str, cwd: str, timeout: int, allow_errors: bool) -> int:
    """Child process: execute the notebook in `src` (as the book reads it), write it to `out`."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError
    nb = nbformat.read(src, as_version=4)
    meta = nb.metadata.get('execution', {})          # as jupyter-cache: a notebook may override
    client = NotebookClient(nb, timeout=meta.get('timeout', timeout),
                            allow_errors=meta.get('allow_errors', allow_errors),
                            record_timing=False, resources={'metadata': {'path': cwd}})
    try: client.execute()
    except (CellExecutionError, CellTimeoutError) as e:
        print(e, file=sys.stderr); return 1
    nbformat.write(nb, out)
    return 0


def _execute(job, records_root, threads, execute_cfg, width=0):
    """Parent: run one chapter in a child process with its own figure-font profile and threads."""
    stem, nb, key = job
    print(f'  {stem:<{width}}  started', flush=True)
    records = records_root / key
    shutil.rmtree(records, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=f'book-{stem}-') as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, str(ROOT / 'tools' / 'figure_fonts.py'),
                        str(tmp / 'ipython' / 'profile_default' / 'startup'), str(records)], check=True)
        import nbformat
        nbformat.write(nb, str(tmp / 'in.ipynb'))
        env = {**os.environ, 'IPYTHONDIR': str(tmp / 'ipython'), 'OMP_NUM_THREADS': str(threads),
               'MKL_NUM_THREADS': str(threads)}
        env.pop('MPLBACKEND', None)                 # the kernels draw with the inline backend
        t0 = time.time()
        proc = subprocess.run([sys.executable, __file__, '--run-one', str(tmp / 'in.ipynb'),
                             str(tmp / 'out.ipynb'), str(ROOT / 'nbs'),
                             str(execute_cfg.get('timeout', 1800)),
                             str(int(bool(execute_cfg.get('allow_errors', False))))], env=env,
                            stderr=subprocess.PIPE, text=True)
        seconds = time.time() - t0
        noise = 'Kernel is running over TCP without encryption'    # jupyter_client, every kernel
        err = ''.join(l for l in proc.stderr.splitlines(True) if noise not in l)
        if err.strip(): print(f'--- {stem}:\n{err}', file=sys.stderr, end='', flush=True)
        rc = proc.returncode
        done = nbformat.read(str(tmp / 'out.ipynb'), as_version=4) if rc == 0 else None
    return stem, nb, done, seconds, rc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--jobs', type=int, default=int(os.environ.get('DPM_BOOK_JOBS', 2)),
                    help='chapters executed at a time (DPM_BOOK_JOBS; default 2)')
    ap.add_argument('--threads', type=int, default=int(os.environ.get('DPM_BOOK_THREADS', 0)) or None,
                    help='threads of each kernel (DPM_BOOK_THREADS; default: cores / jobs)')
    ap.add_argument('--force', action='store_true', help="clear this scale's cache first")
    ap.add_argument('--records', type=Path, default=ROOT / '_build' / 'figure_fonts',
                    help='where the figure-font records of every chapter are copied')
    ap.add_argument('--config-out', type=Path, default=None,
                    help='write the configuration for `jupyter-book build --config` here')
    ap.add_argument('--run-one', nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run_one:
        src, out, cwd, timeout, allow = args.run_one
        return run_one(src, out, cwd, int(timeout), allow == '1')

    from jupyter_cache import get_cache
    import yaml
    t_start = time.time()
    scale, cache_path = scale_name(), cache_dir()
    jobs = max(1, args.jobs)
    threads = args.threads or max(1, (os.cpu_count() or 1) // jobs)
    why = prepare_cache(cache_path, stamp(), force=args.force)
    if why: print(f'book cache ({scale}) cleared: ' + ('asked (--force)' if why == ['--force'] else
                                                     f'{", ".join(why)} changed'), flush=True)
    cache = get_cache(str(cache_path / 'jupyter_cache'))
    records_root = cache_path / 'figure_fonts'
    execute_cfg = yaml.safe_load((ROOT / '_config.yml').read_text()).get('execute', {})
    budgets = read_budgets()
    times_path = cache_path.parent / f'seconds-{scale}.json'     # kept when the cache is cleared
    last = json.loads(times_path.read_text()) if times_path.exists() else {}

    print(f'chapters ({scale} scale, cache {cache_path.relative_to(ROOT)}):', flush=True)
    book = [(p.stem, as_the_book_reads(p)) for p in chapters()]
    width = max(len(stem) for stem, _ in book)
    todo = []
    for stem, nb in book:
        if is_cached(cache, nb, records_root):
            ran = f' (executed in {last[stem]:.1f} s)' if stem in last else ''
            print(f'  {stem:<{width}}  cached{ran}', flush=True)
        else:
            todo.append((stem, nb, notebook_key(cache, nb)))
    todo.sort(key=lambda j: -last.get(j[0], budget(budgets, j[0], scale)))   # longest first
    if todo:
        print(f'executing {len(todo)} of {len(book)} chapters, {jobs} at a time, '
              f'{threads} thread(s) each', flush=True)
    failed, slow = [], []
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(_execute, job, records_root, threads, execute_cfg, width)
                   for job in todo]
        for fut in concurrent.futures.as_completed(futures):
            stem, nb, done, seconds, rc = fut.result()
            limit = budget(budgets, stem, scale)
            if rc != 0:
                failed.append(stem)
                print(f'  {stem:<{width}}  FAILED after {seconds:.0f} s', flush=True)
                for f in futures: f.cancel()            # stop: the build fails anyway
                continue
            store(cache, nb, done, str(ROOT / 'nbs' / f'{stem}.ipynb'), seconds)
            (records_root / notebook_key(cache, nb) / COMPLETE).touch()
            last[stem] = round(seconds, 1)
            print(f'  {stem:<{width}}  {seconds:6.1f} s', flush=True)
            if seconds > limit:
                slow.append(stem)
                print(f'WARNING: {stem} took {seconds:.0f} s, over its budget of {limit:g} s '
                      f'({scale} scale, {BUDGETS.relative_to(ROOT)})', flush=True)
    times_path.write_text(json.dumps(last, indent=1, sort_keys=True) + '\n')
    if failed:
        print(f'chapter(s) failed: {", ".join(failed)} (the traceback is above)', file=sys.stderr)
        return 1

    # the figure-font records of every chapter of the book, executed now or before
    args.records.mkdir(parents=True, exist_ok=True)
    for stem, nb in book:
        for f in sorted((records_root / notebook_key(cache, nb)).glob('*.jsonl')):
            shutil.copyfile(f, args.records / f'{stem}-{f.name}')
    keep = {rec.hashkey for rec in cache.list_cache_records()}
    for d in records_root.glob('*'):
        if d.is_dir() and d.name not in keep: shutil.rmtree(d)   # records of evicted executions
    if args.config_out:
        args.config_out.parent.mkdir(parents=True, exist_ok=True)
        args.config_out.write_text('# Written by tools/execute_book.py from _config.yml: execute '
                                   'from the cache it filled.\n' +
                                   yaml.safe_dump(cache_config(ROOT, cache_path / 'jupyter_cache'),
                                                  sort_keys=False))
    print(f'chapters: {len(todo) - len(failed)} executed, {len(book) - len(todo)} cached, '
          f'{time.time() - t_start:.0f} s' + (f'; over budget: {", ".join(slow)}' if slow else ''),
          flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
