"""Sphinx configuration of the lease_lock documentation (``tox -e docs`` builds it)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Document the checkout the build runs in, not whatever copy happens to be installed.
sys.path.insert(0, str(ROOT))

import lease_lock  # noqa: E402 - after the path is set

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


html_theme = "furo"
html_title = f"lease_lock {release}"
html_static_path = ["_static"]
# Pages written by other hands use fence languages Pygments lacks (crontab); show them plain.
suppress_warnings = ["misc.highlighting_failure"]
