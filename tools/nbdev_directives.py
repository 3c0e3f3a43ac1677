"""Sphinx extension: read nbdev's `#|` cell directives as MyST-NB cell tags.

MyST-NB treats `#| hide` as a plain comment. On `source-read` this rewrites each notebook before
MyST-NB parses (and executes) it: directive lines are removed from the shown code and mapped to
the tags MyST-NB understands. The notebooks themselves keep nbdev's directives as their one source.
"""
import json

# directive -> tag; None means "strip the line, show the cell as is"
TAGS = {
    'hide': 'remove-cell',
    'exporti': None, 'export': None, 'exports': None,
    'code-fold': 'hide-input', 'fold': 'hide-input',
    'echo': 'remove-input',          # `#| echo: false`
    'output': 'remove-output',       # `#| output: false`
    'eval': 'skip-execution',        # `#| eval: false`
    'default_exp': 'remove-cell',
}
FALSE_ONLY = {'echo', 'output', 'eval'}  # these act only when set to false


def _directive(line):
    name, _, value = line[2:].strip().partition(':')
    name, value = name.strip(), value.strip().lower()
    if ' ' in name: name, value = name.split(' ', 1)
    return name, value


def translate(cell):
    """Strip `#|` lines from a code cell and add the MyST-NB tags they stand for."""
    lines = ''.join(cell['source']).splitlines(keepends=True)
    directives = [_directive(l) for l in lines if l.startswith('#|')]
    if not directives: return cell
    tags = cell.setdefault('metadata', {}).setdefault('tags', [])
    for name, value in directives:
        if name in FALSE_ONLY and value != 'false': continue
        if name == 'code-fold' and value == 'false': continue
        tag = TAGS.get(name)
        if tag and tag not in tags: tags.append(tag)
    cell['source'] = ''.join(l for l in lines if not l.startswith('#|')).lstrip('\n')
    return cell


def on_source_read(app, docname, source):
    if not str(app.env.doc2path(docname)).endswith('.ipynb'): return
    nb = json.loads(source[0])
    nb['cells'] = [translate(c) if c['cell_type'] == 'code' else c for c in nb['cells']]
    source[0] = json.dumps(nb)


def setup(app):
    app.connect('source-read', on_source_read)
    return {'parallel_read_safe': True, 'parallel_write_safe': True, 'version': '1'}
