"""The Sphinx extension that turns nbdev's `#|` directives into MyST-NB tags (tools/nbdev_directives.py)."""
import importlib.util
import json
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
