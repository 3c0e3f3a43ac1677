"""The built book (`_build/html`) as a reader sees it: every page opened in a real headless Chromium
(Debian's `chromium`, driven by Playwright), offline.

Every request that is not a local file is aborted and recorded, so a page that would fetch anything
from the network fails here even where the machine could reach it. Each page is loaded, MathJax is
waited for, collapsed code (`hide-input`) is opened, and these defect classes are collected; one test
per class lists every page with that defect:

- console:   an error on the console or an uncaught exception;
- network:   a request that would leave the machine (it is blocked);
- image:     an <img> that does not decode (naturalWidth 0);
- animation: a matplotlib animation (`to_jshtml`) whose controls do not change the frame, or whose
             buttons show no icon;
- math:      MathJax errors, or `$...$`, `\\(...\\)`, `{eq}` or `??` left in the text (not in code);
- label:     a raw label (`eq-...`) in the text outside code blocks;
- leftover:  words a reader cannot follow: NOTES, "the issue", issue numbers (issue-3, issue #3),
             "commit <hash>" (anywhere on the page, code included);
- overflow:  prose, figures, tables or display math wider than the page's content column (sticking
             out of it, or needing a horizontal scroll bar);
- code:      a code cell or a code output wider than the column (a horizontal scroll bar hides part
             of it; outputs wrap, see _static/dpm.css, so an output only fails with an unbreakable
             run of characters wider than the column).

The browser is Debian's `chromium` (tools/test.sh installs it with apt-get), never a browser build
that Playwright downloads (`playwright install` is not used). DPM_CHROMIUM names another binary.
Without a built book or without the browser the tests are skipped with a message, unless
DPM_BOOK_REQUIRED=1 (tools/test.sh), where they fail. DPM_BOOK_HTML points at another built book.
"""
import os
import re
import shutil
import time
import warnings
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).parents[1]
HTML = Path(os.environ.get('DPM_BOOK_HTML', ROOT / '_build' / 'html'))
REQUIRED = bool(os.environ.get('DPM_BOOK_REQUIRED'))
VIEWPORT = {'width': 1280, 'height': 800}        # a laptop: both sidebars shown beside the text
LOCAL = {'file', 'data', 'blob', 'about'}        # schemes that never leave the machine

CLASSES = {
    'console': 'console errors or uncaught exceptions',
    'network': 'requests that would leave the machine (blocked)',
    'image': 'images that do not decode',
    'animation': 'animations whose controls do not work',
    'math': 'MathJax errors or unrendered math / references',
    'label': 'raw equation labels in the text',
    'leftover': 'words a reader cannot follow (notes, issues, commits)',
    'overflow': 'prose, figures, tables or math wider than the content column',
    'code': 'code cells or outputs wider than the content column',
}
# Known defects that need notebook changes, {class: {page: what}}: on these pages a defect of the class
# makes the test an expected failure (XFAIL, with the list) instead of a failure; a defect on any other
# page fails. An entry whose page is clean again is reported as a warning: delete it then.
KNOWN = {}      # notebook defects still expected, by class and page (none: every check is strict)


def skip_or_fail(why):
    if REQUIRED: pytest.fail(why)
    pytest.skip(why)


def chromium():
    """Debian's Chromium binary (or DPM_CHROMIUM); None when there is none."""
    for c in (os.environ.get('DPM_CHROMIUM'), '/usr/lib/chromium/chromium', 'chromium',
              'chromium-browser', 'google-chrome'):
        path = c and (c if Path(c).is_file() else shutil.which(c))
        if path: return str(path)
    return None


REDIRECT = re.compile(r'^\s*<meta http-equiv="Refresh" content="0; url=([^"]+)"', re.I)


def redirect(path):
    """The target of a page that only redirects (the book's root index.html), else None."""
    m = REDIRECT.match(path.read_text(encoding='utf-8', errors='replace')[:500])
    return m and m.group(1)


def book_pages(html=HTML):
    """Every HTML page of the built book (chapters, index, search, genindex), less redirects."""
    return sorted(p for p in html.rglob('*.html') if not redirect(p)
                  and not any(part.startswith('_') for part in p.relative_to(html).parts[:-1]))


# Runs in the page once it has loaded: waits for MathJax and images, opens collapsed code, then
# returns {class: [messages]} for the classes found in the page itself.
INSPECT = r"""
async () => {
  const out = {math: [], label: [], leftover: [], overflow: [], code: [], image: [], animation: [], wrapped: []};
  const cut = (s, n = 100) => { s = s.replace(/\s+/g, ' ').trim(); return s.length > n ? s.slice(0, n) + '...' : s; };
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    try { await MathJax.startup.promise; } catch (e) { out.math.push('MathJax failed: ' + e); }
  }
  document.querySelectorAll('details').forEach(d => d.open = true);     // collapsed code cells
  await Promise.all([...document.images].map(i => i.decode().catch(() => null)));
  await new Promise(r => setTimeout(r, 50));

  // images
  for (const img of document.images) {
    if (img.closest('.animation')) continue;                     // checked with the animations
    if (!img.complete || img.naturalWidth === 0) out.image.push('does not decode: ' + cut(img.getAttribute('src') || '(no src)', 80));
  }

  // MathJax errors
  for (const e of document.querySelectorAll('mjx-merror, [data-mjx-error], .MathJax_Error, merror'))
    out.math.push('MathJax error: ' + cut(e.getAttribute('data-mjx-error') || e.textContent));

  // text: unrendered math, raw labels, leftovers
  const text = (skip) => {
    const found = [];
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      const el = n.parentElement;
      if (!el || el.closest(skip)) continue;
      found.push([n.data, el]);
    }
    return found;
  };
  const context = (el) => cut((el.closest('p, li, dt, dd, td, th, h1, h2, h3, h4, h5, h6, figcaption, pre, div') || el).textContent, 120);
  const scan = (skip, rules) => {
    for (const [data, el] of text(skip))
      for (const [cls, re, what] of rules) {
        const m = data.match(re);
        if (m) out[cls].push(`${what} "${cut(m[0], 40)}" in: ${context(el)}`);
      }
  };
  // not in code (inline or block) and not in MathJax's output
  scan('script, style, noscript, textarea, code, pre, kbd, samp, .highlight, mjx-container, svg', [
    ['math', /\$[^$\s][^$]*\$|\$\$|\\\(|\\\[|\\begin\{/, 'unrendered math'],
    ['math', /\{(eq|numref|ref|doc|cite|glue(:\w+)?)\}/, 'unprocessed role'],
  ]);
  // '??' anywhere outside code: an unresolved reference, also in MathJax's accessible MathML (\eqref)
  scan('script, style, noscript, textarea, code, pre, kbd, samp, .highlight', [
    ['math', /\?\?/, 'unresolved reference'],
  ]);
  // outside code blocks (inline code counts: a label in backticks is still a raw label)
  scan('script, style, noscript, textarea, pre, .highlight, mjx-container, svg', [
    ['label', /\beq-[a-z0-9]+(-[a-z0-9]+)*/, 'raw label'],
  ]);
  // everywhere the reader can read, code included
  scan('script, style, noscript, textarea', [
    ['leftover', /\bNOTES(\.md)?\b/, 'notes'],
    ['leftover', /\bthe issue\b/i, 'issue'],
    ['leftover', /\bissues?[- ]?#?\d+\b/i, 'issue number'],
    ['leftover', /\bcommit(ted)?( in)? [0-9a-f]{7,40}\b/i, 'commit'],
  ]);

  // widths: the content column is the article. MathJax's copy for screen readers
  // (mjx-assistive-mml) is clipped on purpose: hidden while measuring.
  const hide = document.createElement('style');
  hide.textContent = 'mjx-assistive-mml { display: none !important; }';
  document.head.appendChild(hide);
  const article = document.querySelector('article.bd-article') || document.querySelector('article') || document.querySelector('[role=main]');
  if (article) {
    const right = article.getBoundingClientRect().right;
    const name = (el) => {
      const id = el.id || (el.closest('[id]') || {}).id || '';
      return el.tagName.toLowerCase() + (el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\s+/).slice(0, 2).join('.') : '') + (id ? ` (#${id})` : '');
    };
    const clips = (el) => { for (let a = el.parentElement; a && a !== article; a = a.parentElement)
                              if (getComputedStyle(a).overflowX !== 'visible') return true; return false; };
    const isCode = (el) => el.matches('pre, .highlight, div.cell_input, div.cell_output, div.output, .cell_output *, .cell_input *');
    // sticking out of the column (and not inside something that scrolls or clips)
    for (const el of article.querySelectorAll('p, li, dl, blockquote, figure, img, table, mjx-container, .math, .admonition, h1, h2, h3, h4, h5, h6, pre, div.cell_output, div.cell_input')) {
      const r = el.getBoundingClientRect();
      if (!r.width || r.right <= right + 1 || clips(el)) continue;
      out[isCode(el) ? 'code' : 'overflow'].push(`${name(el)} ends ${Math.round(r.right - right)} px right of the column: ${cut(el.textContent, 60)}`);
    }
    // needing a horizontal scroll bar (content cut off at the column)
    for (const el of article.querySelectorAll('*')) {
      const st = getComputedStyle(el), ox = st.overflowX;
      if (ox === 'visible' || st.display === 'inline' || el.clientWidth === 0 || el.scrollWidth <= el.clientWidth + 1) continue;
      out[isCode(el) || el.closest('.cell_input, .cell_output, .highlight') ? 'code' : 'overflow'].push(
        `${name(el)} scrolls: ${el.scrollWidth} px of content in ${el.clientWidth} px: ${cut(el.textContent, 60)}`);
    }
    if (document.documentElement.scrollWidth > document.documentElement.clientWidth + 1)
      out.overflow.push(`the page scrolls sideways: ${document.documentElement.scrollWidth} px in ${document.documentElement.clientWidth} px`);
    // code that wraps at the column (_static/dpm.css): counted for the report, not a defect
    const unwrap = document.createElement('style');
    unwrap.textContent = 'div.cell_input pre, div.cell_output pre { white-space: pre !important; }';
    document.head.appendChild(unwrap);
    for (const pre of article.querySelectorAll('div.cell_input pre, div.cell_output pre'))
      if (pre.clientWidth && pre.scrollWidth > pre.clientWidth + 1) out.wrapped.push(pre.closest('.cell_output') ? 'output' : 'input');
    unwrap.remove();
  } else out.overflow.push('no content column (article) found');
  hide.remove();

  // animations: the controls must change the frame, and the buttons must show their icons
  const pause = (ms) => new Promise(r => setTimeout(r, ms));
  let k = 0;
  for (const anim of document.querySelectorAll('div.animation')) {
    k += 1;
    const img = anim.querySelector('img'), slider = anim.querySelector('input[type=range]');
    const btn = (t) => anim.querySelector(`button[title="${t}"]`);
    const where = `animation ${k}`;
    if (!img || !slider || !btn('Next frame') || !btn('Play') || !btn('First frame')) { out.animation.push(`${where}: controls missing`); continue; }
    const n = parseInt(slider.max) + 1;
    if (!(n >= 2)) { out.animation.push(`${where}: ${n} frame(s)`); continue; }
    btn('First frame').click();                          // the controls set the frame at once
    const first = img.src;
    if (!first.startsWith('data:image/') && !first.startsWith('file:')) { out.animation.push(`${where}: no frame shown`); continue; }
    btn('Next frame').click();
    if (img.src === first) out.animation.push(`${where}: "Next frame" does not change the frame`);
    slider.value = String(n - 1); slider.dispatchEvent(new Event('input'));
    if (img.src === first) out.animation.push(`${where}: the slider does not change the frame`);
    btn('First frame').click();
    if (img.src !== first) out.animation.push(`${where}: "First frame" does not go back`);
    const obj = window['anim' + img.id.replace('_anim_img', '')];   // Play: a timer, every interval ms
    const limit = Math.min(5000, 3 * ((obj && obj.interval) || 200) + 200), t0 = performance.now();
    btn('Play').click();
    while (img.src === first && performance.now() - t0 < limit) await pause(10);
    btn('Pause').click();
    if (img.src === first) out.animation.push(`${where}: "Play" does not change the frame in ${limit} ms`);
    await img.decode().catch(() => out.animation.push(`${where}: a frame does not decode`));
    if (img.naturalWidth === 0) out.animation.push(`${where}: the frame does not decode`);
    const blank = [...anim.querySelectorAll('button')].filter(b => {
      const icon = b.querySelector('svg, i');
      return !icon || icon.getBoundingClientRect().width < 4;
    }).map(b => b.title);
    if (blank.length) out.animation.push(`${where}: buttons without an icon: ${blank.join(', ')}`);
  }
  return out;
}
"""


def inspect_page(browser, path):
    """Open one page offline, as a first visit (a fresh browser context: no stored settings), and
    return {class: [messages]} (empty lists where it is clean)."""
    found = {c: [] for c in [*CLASSES, 'wrapped']}
    context = browser.new_context(viewport=VIEWPORT, service_workers='block')

    def route(r):                                       # only local files; the rest is recorded
        if urlparse(r.request.url).scheme in LOCAL: r.continue_()
        else: found['network'].append(f'blocked: {r.request.url[:150]}'); r.abort('blockedbyclient')
    context.route('**/*', route)
    page = context.new_page()
    page.on('console', lambda m: m.type == 'error' and found['console'].append(
        f"{m.text[:200]} ({m.location.get('url', '').rsplit('/', 1)[-1]}:{m.location.get('lineNumber')})"))
    page.on('pageerror', lambda e: found['console'].append(f'uncaught: {str(e)[:200]}'))
    try:
        page.goto(path.as_uri(), wait_until='load', timeout=60_000)
        page.wait_for_timeout(100)                      # setTimeout(0) of the animations
        for cls, messages in page.evaluate(INSPECT).items(): found[cls] += messages
    except Exception as e:                              # a page that does not load at all
        found['console'].append(f'page did not load or inspect: {type(e).__name__}: {e}'[:300])
    finally:
        context.close()
    found['network'] = list(dict.fromkeys(found['network']))
    return found


def inspect_book(html=HTML, pages=None):
    """{page (relative path): {class: [messages]}} for every page of the book, one browser."""
    try: from playwright.sync_api import sync_playwright
    except ImportError: skip_or_fail('no Playwright for Python (tools/requirements.lock pins it)')
    exe = chromium()
    if exe is None: skip_or_fail('no Chromium: apt-get install chromium (tools/test.sh does)')
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=['--no-sandbox', '--disable-gpu'])
        try:
            return {path.relative_to(html).as_posix(): inspect_page(browser, path)
                    for path in (pages or book_pages(html))}
        finally:
            browser.close()


@pytest.fixture(scope='module')
def book():
    if not HTML.exists() or not book_pages():
        skip_or_fail(f'no built book in {HTML}: run tools/book.sh or tools/test.sh first')
    t0 = time.time()
    report = inspect_book()
    print(f'\n{len(report)} pages inspected in Chromium in {time.time() - t0:.1f} s')
    wrapped = {page: f"{found['wrapped'].count('input')}+{found['wrapped'].count('output')}"
               for page, found in report.items() if found['wrapped']}
    if wrapped:                     # not a defect (nothing is cut), but lines a reader sees broken
        warnings.warn(f'code cells + outputs whose lines wrap at {VIEWPORT["width"]} px: {wrapped}')
    return report


def summary(report, cls, pages=None):
    return '\n'.join(f'{page}:\n' + '\n'.join(f'    {m}' for m in found[cls][:12])
                     + (f'\n    ... and {len(found[cls]) - 12} more' if len(found[cls]) > 12 else '')
                     for page, found in report.items() if found[cls] and (pages is None or page in pages))


@pytest.mark.parametrize('cls', CLASSES)
def test_book_pages(book, cls):
    """No page of the book has a defect of this class (the message lists them page by page); the
    known defects (KNOWN) make it an expected failure."""
    known = KNOWN.get(cls, {})
    new = summary(book, cls, [p for p in book if p not in known])
    assert not new, f'{CLASSES[cls]}:\n{new}'
    stale = [p for p in known if p in book and not book[p][cls]]
    if stale: warnings.warn(f'known {cls} defects are gone, delete them from KNOWN: {stale}')
    if any(book[p][cls] for p in known if p in book):
        pytest.xfail(f'known notebook defects, {CLASSES[cls]}:\n{summary(book, cls, known)}')


def test_every_chapter_is_inspected(book):
    chapters = [p for p in book if p.startswith('nbs/')]
    assert len(chapters) >= 10 and 'nbs/index.html' in book, sorted(book)
    for page in HTML.rglob('*.html'):          # the pages left out only redirect, to a page that exists
        if redirect(page): assert (page.parent / redirect(page)).is_file(), (page, redirect(page))


BROKEN = r"""<!DOCTYPE html><html><head><meta charset="utf-8">
<link rel="stylesheet" href="https://cdn.example.org/font-awesome.min.css"></head>
<body><div class="bd-content"><article class="bd-article" role="main" style="width: 600px">
<p>A sentence with unrendered $x^2$ math, a raw label eq-forward-kernel and the issue here.</p>
<p>See issue-3, fixed in commit 1a2b3c4d; and an unresolved (??) reference.</p>
<img src="missing.png">
<table><tr><td style="white-space: nowrap">%s</td></tr></table>
<div class="cell_output"><pre style="overflow-x: auto">%s</pre></div>
<div class="animation"><img id="_anim_img0" src="data:image/gif;base64,R0lGODlhAQABAAAAACw=">
  <input type="range" min="0" max="2" value="0">
  <button title="First frame">&lt;</button><button title="Next frame">&gt;</button>
  <button title="Play">p</button><button title="Pause">||</button></div>
</article></div>
<script>console.error('a console error'); fetch('https://example.org/data.json');</script>
</body></html>""" % ('wide ' * 200, 'x' * 400)


def test_the_checks_catch_broken_pages(tmp_path):
    """One made-up page with a defect of every class: each class is found (the checks can fail)."""
    page = tmp_path / 'broken.html'
    page.write_text(BROKEN)
    if chromium() is None and not REQUIRED: pytest.skip('no Chromium')
    found = inspect_book(tmp_path, [page])['broken.html']
    missed = [c for c in CLASSES if not found[c]]
    assert not missed, f'classes not detected: {missed}; found: {found}'
    assert any('font-awesome' in m for m in found['network']), found['network']
    assert any('example.org/data.json' in m for m in found['network']), found['network']
    assert any('a console error' in m for m in found['console']), found['console']
    assert len(found['leftover']) >= 3, found['leftover']
