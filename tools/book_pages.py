"""Sphinx extension: every page of the book reads offline and loads without a console error.

Four defects of the stock Jupyter Book 1 build, each an error in the reader's console:

- MathJax twice. Jupyter Book adds every `*.js` under `_static/` to `html_js_files`, so the local
  MathJax (`mathjax_path`, copied to `_static/mathjax/` by tools/env.sh) is loaded on every page
  as a plain script besides the deferred copy that `sphinx.ext.mathjax` adds after its
  configuration ("Cannot set property Package ..."). The plain entry is dropped here, and the
  deferred one is put on every page (assets policy 'always'): the navigation shows chapter titles
  with math (\(K\)) on pages without equations too (search, index, references).
- Configuration scripts twice. Sphinx 7 adds an inline script registered with `add_js_file(None,
  body=...)` once as filename None and once as '' (sphinx-thebe: "Identifier 'THEBE_JS_URL' has
  already been declared"; sphinx-togglebutton's selector). Each page's scripts are deduplicated.
- A stylesheet from a CDN. matplotlib's `to_jshtml` animations link font-awesome 4 from a CDN for
  the icons of their buttons. The theme's own Font Awesome (`scripts/fontawesome.js`, served
  locally) already draws `<i class="fa fa-...">` icons, so the link is removed from the outputs.
- No colour mode on a first visit. pydata-sphinx-theme reads the mode from the browser's storage or
  else from `html_context['default_mode']`; left empty, the first page a reader opens logs "Got
  invalid theme mode". It is set to 'auto' (follow the system), the theme's own default.

tests/test_browser.py opens every page in Chromium with the network blocked and fails on any of
these.
"""
import re

from docutils import nodes

# <link ...> elements of raw HTML outputs that point off the machine (http:, https: or //host)
REMOTE_LINK = re.compile(r'<link\b[^>]*\bhref\s*=\s*["\']?(?:https?:)?//[^>]*>\s*', re.I)


def configure(app, config):
    """Remove the MathJax file that Jupyter Book put in html_js_files (sphinx.ext.mathjax loads it);
    give the theme its default colour mode."""
    config.html_context.setdefault('default_mode', 'auto')
    path = config.mathjax_path
    config.html_js_files = [js for js in config.html_js_files
                            if (js[0] if isinstance(js, (tuple, list)) else js) != path]


def strip_remote_links(app, doctree, docname):
    """Remove <link href="http..."> (stylesheets from a CDN) from raw HTML outputs of a page."""
    for node in list(doctree.findall(nodes.raw)):
        if 'html' not in node.get('format', '').split(): continue
        text = node.astext()
        stripped = REMOTE_LINK.sub('', text)
        if stripped != text:
            node.replace_self(nodes.raw(node.rawsource, stripped, **node.attributes))


def _key(js):
    return (str(js.filename or ''), tuple(sorted(js.attributes.items())))


def dedupe_scripts(app, pagename, templatename, context, doctree):
    """Keep the first of scripts that are equal but for None vs '' as filename."""
    scripts = context.get('script_files')
    if not isinstance(scripts, list): return
    seen, keep = set(), []
    for js in scripts:
        key = _key(js) if hasattr(js, 'attributes') else ('', str(js))
        if key in seen: continue
        seen.add(key); keep.append(js)
    scripts[:] = keep


def setup(app):
    app.set_html_assets_policy('always')                             # MathJax for the navigation
    app.connect('config-inited', configure, priority=400)          # before Sphinx converts the list
    app.connect('doctree-resolved', strip_remote_links)
    app.connect('html-page-context', dedupe_scripts, priority=900)  # after the themes add theirs
    return {'parallel_read_safe': True, 'parallel_write_safe': True, 'version': '1'}
