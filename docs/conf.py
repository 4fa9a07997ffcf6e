"""Sphinx configuration of the lease_lock documentation (``tox -e docs`` builds it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
# Document the checkout the build runs in, not whatever copy happens to be installed.
sys.path.insert(0, str(ROOT))
# The command reference reads its parser from docs/generate.py.
sys.path.insert(1, str(ROOT / "docs"))

import lease_lock  # noqa: E402 - after the path is set

if TYPE_CHECKING:
    from docutils import nodes
    from sphinx.application import Sphinx

project = "lease_lock"
author = "the lease_lock authors"
copyright = "the lease_lock authors"
release = lease_lock.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinxarg.ext",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": True}
# A single-backquoted name in a docstring links to it when it can.
default_role = "py:obj"
# Text is shown as written: smart quotes would turn the "--" of an option named in running text
# into an en dash and "'" into a curly quote, and a reader copying them gets a broken command.
smartquotes = False


html_theme = "furo"
html_title = f"lease_lock {release}"
html_static_path = ["_static"]
# Pages written by other hands use fence languages Pygments lacks (crontab); show them plain.
suppress_warnings = ["misc.highlighting_failure"]


def _add_defining_module_ids(app: Sphinx, doctree: nodes.document) -> None:
    """Give an object documented under a re-exporting module the id of its defining module too.

    viewcode's "[docs]" links on a source page all point at ``<module>.<name>`` with one module:
    the one under which the build first met a name of that file. That is the defining module
    when one of its names is documented there (``lease_lock.backends.base.parse_url_options``),
    though its other names are documented under the package that re-exports them
    (``lease_lock.Backend``). With both ids every such link lands on the object's entry.
    """
    from sphinx import addnodes

    for signature in doctree.findall(addnodes.desc_signature):
        module, fullname = signature.get("module"), signature.get("fullname")
        if not module or not fullname or not signature["ids"]:
            continue
        top = fullname.split(".", 1)[0]
        defining = getattr(getattr(sys.modules.get(module), top, None), "__module__", None)
        if isinstance(defining, str) and defining != module:
            alias = f"{defining}.{fullname}"
            # Never a second element with one id: the object may be documented there as well.
            if alias not in doctree.ids:
                signature["ids"].append(alias)
                doctree.ids[alias] = signature


def setup(app: Sphinx) -> None:
    """Register the id aliases above."""
    app.connect("doctree-read", _add_defining_module_ids)
