"""Sphinx extension: read nbdev's `#|` cell directives as MyST-NB cell tags, and link exported
code to the equations it implements.

MyST-NB treats `#| hide` as a plain comment. On `source-read` this rewrites each notebook before
MyST-NB parses (and executes) it: directive lines are removed from the shown code and mapped to
the tags MyST-NB understands. Below every shown export cell that cites equation labels (`eq-...`
in its docstrings or comments) it inserts a line "Implements (1), (4)" whose numbers are `{eq}`
links to those equations, in any chapter. The notebooks themselves keep nbdev's directives as their
one source; the inserted lines exist only in the book.
"""
import json
import re

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
EXPORTS = {'export', 'exports', 'exporti'}
HIDDEN = {'remove-cell', 'remove-input'}
EQ_LABEL = re.compile(r'\beq-[a-z0-9]+(?:-[a-z0-9]+)*')


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


def is_export(cell):
    """Whether a cell is exported to the package (`#| export`, `exports` or `exporti`)."""
    return cell['cell_type'] == 'code' and any(
        l.startswith('#|') and _directive(l)[0] in EXPORTS for l in ''.join(cell['source']).splitlines())


def cited_equations(cell):
    """The `eq-...` labels an export cell cites, in order of first mention ([] for other cells)."""
    if not is_export(cell): return []
    return list(dict.fromkeys(EQ_LABEL.findall(''.join(cell['source']))))


def implements_cell(cell, labels):
    """The markdown cell shown below an export cell: links to the equations it implements."""
    links = ', '.join(f'{{eq}}`{label}`' for label in labels)
    return {'cell_type': 'markdown', 'id': f"{cell.get('id', 'cell')}-implements",
            'metadata': {'tags': ['dpm-implements']}, 'source': f'*Implements* {links}.'}


def with_equation_links(cells):
    """Translate every code cell; put an "Implements" line below each shown export cell."""
    out = []
    for cell in cells:
        labels = cited_equations(cell)
        if cell['cell_type'] == 'code': cell = translate(cell)
        out.append(cell)
        if labels and not HIDDEN & set(cell.get('metadata', {}).get('tags', [])):
            out.append(implements_cell(cell, labels))
    return out


def on_source_read(app, docname, source):
    if not str(app.env.doc2path(docname)).endswith('.ipynb'): return
    nb = json.loads(source[0])
    nb['cells'] = with_equation_links(nb['cells'])
    source[0] = json.dumps(nb)


def setup(app):
    app.connect('source-read', on_source_read)
    return {'parallel_read_safe': True, 'parallel_write_safe': True, 'version': '1'}
