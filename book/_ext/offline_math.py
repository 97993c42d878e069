"""Serve MathJax from the built site, so the book's maths renders with no network.

MathJax comes from the `jupyter-server-mathjax` package (a dev dependency in pyproject.toml);
its files are copied into `_static/mathjax/` of the built book and every page loads it from
there instead of from a CDN. tests/test_book.py fails if a page loads anything from http(s), and
opens every page in headless Chromium: no request may fail, every equation must be typeset.
"""

import shutil
from pathlib import Path

import jupyter_server_mathjax

MATHJAX = Path(jupyter_server_mathjax.__file__).parent / "static"


# MathJax 2.7 as the package ships it: the one combined configuration (its parts have no config.js
# of their own), the HTML-CSS output and the STIX-Web fonts (not MathJax's TeX fonts, which the
# package leaves out: asking for them gives "[Math Processing Error]" wherever a TeX-font glyph
# such as the prime of m' is needed, and 404s for fontdata.js and the .otf files).
MATHJAX_CONFIG = {
    # the theme marks sections tex2jax_ignore and lists the classes to typeset for MathJax 3;
    # the same list for MathJax 2
    "tex2jax": {"processClass": "tex2jax_process|mathjax_process|math|output_area"},
    "HTML-CSS": {"availableFonts": [], "preferredFont": None, "webFont": "STIX-Web", "imageFont": None,
                 # a page's equations in one pass, not in chunks of 50 with a pause between: less
                 # layout work on the long pages (a fifth of the time in headless Chromium)
                 "EqnChunk": 10000, "EqnChunkDelay": 0},
    # no quick preview drawn first and then replaced: each equation is typeset once
    "fast-preview": {"disabled": True},
    # only HTML-CSS is shipped: the menu offers no other renderer
    "MathMenu": {"showRenderer": False, "showFontMenu": False},
    # the hidden MathML kept for screen readers would otherwise take the NativeMML output's
    # font list and fetch TeX .otf fonts that are not there (a \mathbb or \mathcal in a page)
    "styles": {".MJX_Assistive_MathML [mathvariant]": {"font-family": "inherit"}},
}


def _use_local_mathjax(app, config):
    config.mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
    config.mathjax2_config = MATHJAX_CONFIG


def _copy_mathjax(app, exception):
    if exception is None and app.builder.format == "html":
        shutil.copytree(MATHJAX, Path(app.outdir) / "_static" / "mathjax", dirs_exist_ok=True)


def _drop_remote_loaders(app, pagename, templatename, context, doctree):
    # sphinx-thebe (added by Jupyter Book) would fetch its JavaScript from a CDN; the book
    # has no launch buttons, so its scripts are left out of every page
    context["script_files"] = [js for js in context.get("script_files", [])
                               if "thebe" not in str(js) and "thebe" not in str(getattr(js, "attributes", {}))]


def setup(app):
    app.connect("config-inited", _use_local_mathjax)
    app.connect("html-page-context", _drop_remote_loaders)
    app.connect("build-finished", _copy_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
