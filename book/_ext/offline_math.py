"""Serve MathJax from the built site, so the book's maths renders with no network.

MathJax comes from the `jupyter-server-mathjax` package (a dev dependency in pyproject.toml);
its files are copied into `_static/mathjax/` of the built book and every page loads it from
there instead of from a CDN. tests/test_book.py fails if a page loads anything from http(s).
"""

import shutil
from pathlib import Path

import jupyter_server_mathjax

MATHJAX = Path(jupyter_server_mathjax.__file__).parent / "static"


def _use_local_mathjax(app, config):
    config.mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"  # MathJax 2.7
    # the theme marks sections tex2jax_ignore and lists the classes to typeset for MathJax 3;
    # the same list for MathJax 2
    config.mathjax2_config = {"tex2jax": {"processClass": "tex2jax_process|mathjax_process|math|output_area"}}


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
