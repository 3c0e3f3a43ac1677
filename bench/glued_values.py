"""Dump a notebook's glued values (and per-cell timings) from an executed copy.

    python bench/glued_values.py EXECUTED.ipynb [--times] > values.json

Glued values are the `display_data` outputs that `myst_nb.glue` writes (metadata key
`scrapbook`); the value is their text/plain form. With `--times`, the per-cell seconds that
nbclient records (`metadata.execution`) are listed too, slowest first.
"""
import json, sys
from datetime import datetime

import nbformat


def glued(nb):
    "Map each glue name to the text/plain of its value."
    out = {}
    for cell in nb.cells:
        for o in cell.get('outputs', []):
            book = o.get('metadata', {}).get('scrapbook', {})
            if 'name' in book:                    # myst_nb: data under '<mime_prefix>text/plain'
                data = o.get('data', {})
                out[book['name']] = data.get(book.get('mime_prefix', '') + 'text/plain',
                                             data.get('text/plain'))
    return out


def cell_seconds(nb):
    "(seconds, cell index, first source line) for each executed code cell."
    rows = []
    for i, cell in enumerate(nb.cells):
        ex = cell.get('metadata', {}).get('execution', {})
        a, b = ex.get('iopub.execute_input'), ex.get('shell.execute_reply')
        if a and b:
            dt = (datetime.fromisoformat(b.rstrip('Z')) - datetime.fromisoformat(a.rstrip('Z')))
            rows.append((round(dt.total_seconds(), 2), i, cell.source.splitlines()[0][:70]
                         if cell.source else ''))
    return sorted(rows, reverse=True)


if __name__ == '__main__':
    if len(sys.argv) < 2:
        sys.exit('usage: python bench/glued_values.py EXECUTED.ipynb [--times]')
    nb = nbformat.read(sys.argv[1], as_version=4)
    res = {'glued': glued(nb)}
    if '--times' in sys.argv:
        res['cell_seconds'] = cell_seconds(nb)
    json.dump(res, sys.stdout, indent=1)
    print()
