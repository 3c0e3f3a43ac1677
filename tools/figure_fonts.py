"""The size of every text in the book's figures, as a reader sees it on the page.

A PNG does not say how large its letters are, so the measurement is taken where the figures are
drawn: tools/book.sh makes every kernel of the book build load this module (an IPython startup file
in a profile under _build, written by `python tools/figure_fonts.py STARTUP_DIR RECORDS_DIR`).
`install` then
- sets the book's matplotlib baseline (`BASELINE`: default texts of 11 pt, 'small' ones of 9 pt);
- records, for every figure matplotlib renders as a PNG in memory -- what the inline backend,
  myst-nb's `glue` and `Animation.to_jshtml` put into a page; never a file a command writes -- the
  smallest text it draws: one JSON line per PNG in RECORDS_DIR/<pid>.jsonl, keyed by the PNG's sha1.

tests/test_book.py finds the PNGs of the executed notebooks (_build/jupyter_execute) among these
records by their hash (`figures`), so each measurement is tied to its chapter and figure, and checks
the size each text has on the page (`rendered_pt`): the page shows a PNG at one CSS pixel per image
pixel (96 per inch) and scales a PNG wider than the content column down to the column's width.
"""
import base64
import functools
import hashlib
import io
import json
import os
import re
import sys
from pathlib import Path

MIN_PT = 8.0            # the smallest text a figure may show, in points as rendered on the page
# The content column of a page in a 1280-px wide window (tests/test_browser.py's VIEWPORT, both
# sidebars shown), in CSS pixels: a paragraph's width measured in Chromium (688 px; 790 px at most
# on a wider screen). Body text there is 16 px = 12 pt.
COLUMN_PX = 688
PT_PER_CSS_PX = 0.75    # 96 CSS pixels per inch, 72 points per inch
# The book's matplotlib baseline: matplotlib's font.size 10 makes the 'small' and 'x-small' texts of
# legends and annotations 8.3 and 6.9 pt; 11 makes them 9.2 and 7.6 pt, and every default text
# (ticks, labels, legends, titles) at least 11 pt, which stays at 8 pt or more on the page in a PNG
# up to 985 pixels wide (9.8 inches at matplotlib's 100 dpi; 1.4 columns).
BASELINE = {'font.size': 11}
PNG = b'\x89PNG\r\n\x1a\n'

_collecting = []        # a list of (pixels, points, text) per PNG being rendered, innermost last


def rendered_pt(text_px: float, width_px: int, column_px: float = COLUMN_PX) -> float:
    """The size in points on the page of a text `text_px` pixels high in a PNG `width_px` wide."""
    return text_px * PT_PER_CSS_PX * min(1.0, column_px / width_px)


def png_size(data: bytes) -> tuple:
    """(width, height) in pixels of a PNG, from its header."""
    if data[:8] != PNG: raise ValueError('not a PNG')
    return int.from_bytes(data[16:20], 'big'), int.from_bytes(data[20:24], 'big')


def _record(data: bytes, texts: list, fig) -> dict:
    width, height = png_size(data)
    rec = dict(sha1=hashlib.sha1(data).hexdigest(), width_px=width, height_px=height,
               fig_inches=[round(float(v), 3) for v in fig.get_size_inches()], n_texts=len(texts))
    if texts:
        px, pt, text = min(texts)
        rec.update(min_px=px, min_fontsize=pt, min_text=text[:60],
                   min_rendered_pt=round(rendered_pt(px, width), 2))
    return rec


def install(records_dir, rc: dict = BASELINE):
    """Set the baseline and record the smallest text of every figure rendered as a PNG in memory."""
    import matplotlib
    from matplotlib.backend_bases import FigureCanvasBase
    from matplotlib.text import Text
    matplotlib.rcParams.update(rc)
    records_dir = Path(records_dir)
    records_dir.mkdir(parents=True, exist_ok=True)
    out = records_dir / f'{os.getpid()}.jsonl'
    draw_text, print_figure = Text.draw, FigureCanvasBase.print_figure

    @functools.wraps(draw_text)                 # keeps the rasterization flag of the original
    def draw(self, renderer, *args, **kwargs):
        text = self.get_text()
        if _collecting and renderer is not None and self.get_visible() and text.strip():
            size = self.get_fontsize()
            _collecting[-1].append((float(renderer.points_to_pixels(size)), float(size), text))
        return draw_text(self, renderer, *args, **kwargs)

    @functools.wraps(print_figure)
    def printed(self, filename, *args, **kwargs):
        if not isinstance(filename, io.BytesIO):          # a file: not shown by the book
            return print_figure(self, filename, *args, **kwargs)
        start = filename.tell()
        _collecting.append([])
        try: result = print_figure(self, filename, *args, **kwargs)
        finally: texts = _collecting.pop()
        data = filename.getvalue()[start:]
        if data[:8] == PNG:
            with open(out, 'a') as f: f.write(json.dumps(_record(data, texts, self.figure)) + '\n')
        return result

    Text.draw, FigureCanvasBase.print_figure = draw, printed


def load_records(records_dir) -> dict:
    """sha1 -> record, over every kernel's file in `records_dir`."""
    recs = {}
    for path in sorted(Path(records_dir).glob('*.jsonl')):
        for line in path.read_text().splitlines():
            if line.strip(): r = json.loads(line); recs[r['sha1']] = r
    return recs


def _glue_figures(nb: dict) -> list:
    """The names of the `{glue:figure}` directives of a notebook's markdown, in reading order."""
    text = '\n'.join(''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'markdown')
    return re.findall(r'```\{glue:figure\}\s*(\S+)', text)


def _pngs(output: dict):
    """(how, PNG bytes) of one output: its image/png (also glued, `display=False`) and the frames
    of an animation (`to_jshtml`) in its HTML."""
    data = output.get('data', {})
    for key, value in data.items():
        if key.endswith('image/png'):
            yield 'image', base64.b64decode(''.join(value) if isinstance(value, list) else value)
        elif key.endswith('text/html'):
            html = ''.join(value) if isinstance(value, list) else value
            # to_jshtml: base64 in lines that end in a backslash (a JavaScript line continuation)
            for frame in re.findall(r'data:image/png;base64,([A-Za-z0-9+/=\\\s]+)', html):
                yield 'animation frame', base64.b64decode(re.sub(r'[\\\s]', '', frame))


def figures(executed_nb, records: dict) -> list:
    """Every PNG an executed notebook shows, glued ones included (myst-nb keeps those in
    `<chapter>.glue.json` beside the notebook), with where it is and its record (None: not drawn by
    this build's matplotlib, e.g. a committed PNG file shown as it is)."""
    executed_nb = Path(executed_nb)
    nb = json.loads(executed_nb.read_text(encoding='utf-8'))
    glue_file = executed_nb.with_suffix('.glue.json')
    glued = json.loads(glue_file.read_text(encoding='utf-8')) if glue_file.exists() else {}
    numbered = _glue_figures(nb)
    outputs = [(f'glued {name!r}', name, out) for name, out in glued.items()]
    outputs += [(f'cell {i}', out.get('metadata', {}).get('scrapbook', {}).get('name'), out)
                for i, cell in enumerate(nb['cells']) for out in cell.get('outputs', [])]
    rows = []
    for where, name, output in outputs:
        if name in numbered: where = f"Fig. {numbered.index(name) + 1} ({name!r})"
        for how, data in _pngs(output):
            rows.append(dict(where=where if how == 'image' else f'{where} ({how})',
                             width_px=png_size(data)[0],
                             record=records.get(hashlib.sha1(data).hexdigest())))
    return rows


if __name__ == '__main__':            # python tools/figure_fonts.py STARTUP_DIR RECORDS_DIR
    startup, records = (Path(a).resolve() for a in sys.argv[1:3])
    startup.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve()
    (startup / '00-dpm-figure-fonts.py').write_text(
        '# Written by tools/book.sh: the book kernels measure their figures (figure_fonts.py).\n'
        'import importlib.util as _u\n'
        f'_s = _u.spec_from_file_location("dpm_figure_fonts", {str(here)!r})\n'
        '_m = _u.module_from_spec(_s); _s.loader.exec_module(_m)\n'
        f'_m.install({str(records)!r})\n'
        'del _u, _s, _m\n')
