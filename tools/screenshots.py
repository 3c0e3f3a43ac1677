#!/usr/bin/env python
"""Screenshots of built book pages, as a reader sees them: Debian's headless Chromium, offline.

    python tools/screenshots.py SUFFIX PAGE[#ANCHOR][@SCROLL] ...   # from the repository root

Each page of _build/html (e.g. `nbs/13_mnist.html#samples` or `nbs/16_results.html@2400`) is opened
with the network blocked, scrolled to the anchor (or to SCROLL pixels), and saved as
results/screenshots/<page>_<SUFFIX>.png (1100 x 1400 px), so the small and the full build can be
looked at side by side. Chromium is the one tests/test_browser.py uses (DPM_CHROMIUM first).
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tests'))
from test_browser import chromium      # noqa: E402  (Debian's Chromium, or DPM_CHROMIUM)
HTML, OUT = ROOT / '_build' / 'html', ROOT / 'results' / 'screenshots'


def shoot(page, suffix: str, spec: str) -> Path:
    path, _, scroll = spec.partition('@')
    path, _, anchor = path.partition('#')
    if not (HTML / path).is_file(): sys.exit(f'no page {HTML / path}: build the book first')
    page.goto((HTML / path).as_uri() + (f'#{anchor}' if anchor else ''))
    page.wait_for_load_state('load')
    page.wait_for_timeout(1500)                       # MathJax typesets after load
    if scroll: page.evaluate(f'window.scrollTo(0, {int(scroll)})')
    out = OUT / f"{Path(path).stem}{'_' + anchor if anchor else ''}_{suffix}.png"
    page.screenshot(path=str(out))
    return out


def main(argv):
    if len(argv) < 2: sys.exit(__doc__)
    from playwright.sync_api import sync_playwright
    exe = chromium()
    if exe is None: sys.exit('no Chromium: apt-get install chromium (or set DPM_CHROMIUM)')
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=['--no-sandbox', '--disable-gpu'])
        page = browser.new_page(viewport={'width': 1100, 'height': 1400})
        page.route('http*://**', lambda route: route.abort())          # offline, as in the test
        for spec in argv[1:]: print(shoot(page, argv[0], spec))
        browser.close()


if __name__ == '__main__':
    main(sys.argv[1:])
