#!/usr/bin/env python
"""Count the code a reader sees in each chapter, and how much of it only writes the page.

    python tools/page_code.py            # from the repository root: a table, one row per chapter

A code cell is shown unless the book hides its input: a `hide-input`, `remove-input` or
`remove-cell` tag, in the cell's metadata or from an nbdev directive (`#| code-fold: true`,
`#| echo: false`, `#| hide`; tools/nbdev_directives.py translates them as the book does). Its lines
are the non-blank lines the page shows (directive lines stripped). A shown cell builds page text
when it calls `glue(...)` or `Markdown(...)`, or a function of the chapter that does: such code belongs in a folded (`hide-input`) cell, so
that a reader sees the mathematics, the model and the checks, and finds "show code" for the rest.
tests/test_structure.py keeps the page-building share small, per chapter and over the book.
"""
import ast
import copy
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tools'))
import nbdev_directives  # noqa: E402  (tools/, the book's own cell translation)

FOLDED = {'hide-input', 'remove-input', 'remove-cell'}


def chapters(root=ROOT) -> list:
    "Notebook names in the order of _toc.yml."
    return re.findall(r'(?:root|file):\s*nbs/(\S+)', (Path(root) / '_toc.yml').read_text())


def shown_cells(cells) -> list:
    "The sources of the code cells whose input the book shows, as the book shows them."
    out = []
    for cell in cells:
        if cell['cell_type'] != 'code': continue
        cell = nbdev_directives.translate(copy.deepcopy(cell))
        if FOLDED & set(cell.get('metadata', {}).get('tags', [])): continue
        out.append(''.join(cell['source']))
    return out


def page_names(cells) -> set:
    """`glue`, `Markdown` and every name the chapter defines that calls one of them (a helper
    `def put(name, v): glue(...)`, a sentence builder that glues), to a fixed point."""
    names, defs = {'glue', 'Markdown'}, {}
    for cell in cells:
        if cell['cell_type'] != 'code': continue
        source = ''.join(cell['source'])
        try: tree = ast.parse('\n'.join(l for l in source.splitlines()
                                         if not l.lstrip().startswith(('%', '!'))))
        except SyntaxError: continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs[node.name] = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Lambda, ast.Call)):
                used = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
                for t in node.targets:
                    if isinstance(t, ast.Name): defs.setdefault(t.id, set()).update(used)
    while True:
        more = {name for name, used in defs.items() if used & names} - names
        if not more: return names
        names |= more


def count(cells) -> tuple:
    "(shown code lines, of them lines of cells that build page text): non-blank lines only."
    calls = re.compile(r'\b(?:' + '|'.join(sorted(map(re.escape, page_names(cells)))) + r')\(')
    shown = page = 0
    for src in shown_cells(cells):
        n = sum(1 for line in src.splitlines() if line.strip())
        shown += n
        if calls.search(src): page += n
    return shown, page


def book_counts(root=ROOT) -> dict:
    "chapter -> (shown lines, page-building lines), for every notebook chapter of _toc.yml."
    out = {}
    for name in chapters(root):
        path = Path(root) / 'nbs' / f'{name}.ipynb'
        if path.exists(): out[name] = count(json.loads(path.read_text())['cells'])
    return out


def main():
    counts = book_counts()
    print(f"{'chapter':<22}{'shown':>7}{'page':>7}{'share':>8}")
    for name, (shown, page) in counts.items():
        print(f"{name:<22}{shown:>7}{page:>7}{page / max(shown, 1):>8.1%}")
    shown, page = (sum(c[i] for c in counts.values()) for i in (0, 1))
    print(f"{'book':<22}{shown:>7}{page:>7}{page / max(shown, 1):>8.1%}")


if __name__ == '__main__':
    main()
