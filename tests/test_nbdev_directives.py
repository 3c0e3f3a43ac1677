"""The Sphinx extension that turns nbdev's `#|` directives into MyST-NB tags (tools/nbdev_directives.py)."""
import importlib.util
import json
import re
from pathlib import Path

spec = importlib.util.spec_from_file_location('nbdev_directives', Path(__file__).parents[1] / 'tools' / 'nbdev_directives.py')
nbdev_directives = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nbdev_directives)


def cell(source):
    return {'cell_type': 'code', 'metadata': {}, 'source': source, 'outputs': [], 'execution_count': None}


def test_hide_removes_the_cell_and_strips_the_line():
    c = nbdev_directives.translate(cell('#| hide\nimport os\n'))
    assert c['metadata']['tags'] == ['remove-cell'] and c['source'] == 'import os\n'


def test_export_shows_the_code_without_the_directive():
    c = nbdev_directives.translate(cell('#| export\ndef f(): pass\n'))
    assert c['metadata']['tags'] == [] and c['source'] == 'def f(): pass\n'


def test_code_fold_and_false_only_directives():
    assert nbdev_directives.translate(cell('#| code-fold: true\nplot()'))['metadata']['tags'] == ['hide-input']
    assert nbdev_directives.translate(cell('#| echo: false\nx'))['metadata']['tags'] == ['remove-input']
    assert nbdev_directives.translate(cell('#| echo: true\nx'))['metadata']['tags'] == []
    assert nbdev_directives.translate(cell('#| eval: false\nx'))['metadata']['tags'] == ['skip-execution']


def test_every_directive_in_the_book_is_understood():
    """No notebook may use a directive the extension does not know: it would print in the book."""
    known = set(nbdev_directives.TAGS)
    for nb in (Path(__file__).parents[1] / 'nbs').glob('*.ipynb'):
        for c in json.loads(nb.read_text())['cells']:
            if c['cell_type'] != 'code': continue
            for line in ''.join(c['source']).splitlines():
                if line.startswith('#|'):
                    name, _ = nbdev_directives._directive(line)
                    assert name in known, f'{nb.name}: unknown directive {line!r}'


def markdown(source):
    return {'cell_type': 'markdown', 'metadata': {}, 'source': source}


def test_export_cells_link_the_equations_they_cite():
    cells = [cell('#| export\ndef k(x):\n    "eq-gauss-kernel, then eq-k-general and eq-gauss-kernel"\n'),
             cell('#| export\ndef f(): pass  # no equation\n'),
             cell('#| hide\n#| export\ndef g(): "eq-hidden"\n'),
             cell('x = 1  # eq-not-exported: a plain cell cites nothing\n'),
             cell('#| exports\ndef h(): "eq-b-2 (see eq-b-2.)"\n'),
             cell('#| export\nfreq-1  # not a label: eq- must start a word\n')]
    out = nbdev_directives.with_equation_links([dict(c, id=str(i)) for i, c in enumerate(cells)])
    links = [c['source'] for c in out if c['cell_type'] == 'markdown']
    assert links == ['*Implements* {eq}`eq-gauss-kernel`, {eq}`eq-k-general`.',
                     '*Implements* {eq}`eq-b-2`.']
    assert out[1]['id'] == '0-implements' and out[0]['source'].startswith('def k')   # directive stripped
    assert [c['cell_type'] for c in out] == ['code', 'markdown', 'code', 'code', 'code', 'code',
                                             'markdown', 'code']


def _labels_and_citations():
    """Equation labels defined in the chapters' markdown, and those cited by export cells."""
    defined, cited = set(), {}
    for nb in sorted((Path(__file__).parents[1] / 'nbs').glob('*.ipynb')):
        for c in json.loads(nb.read_text())['cells']:
            text = ''.join(c['source'])
            if c['cell_type'] == 'markdown':
                defined |= set(re.findall(r'\$\$\s*\((eq-[\w-]+)\)', text))
                defined |= set(re.findall(r':label:\s*(eq-[\w-]+)', text))
            for label in nbdev_directives.cited_equations(c): cited.setdefault(label, nb.name)
    return defined, cited


def test_every_cited_equation_exists():
    """An export cell citing a label no chapter defines would be a dead link (the -W build fails)."""
    defined, cited = _labels_and_citations()
    missing = {label: nb for label, nb in cited.items() if label not in defined}
    assert not missing, f'export cells cite equation labels that no chapter defines: {missing}'
    assert len(cited) > 50          # the chapters do cite their equations
