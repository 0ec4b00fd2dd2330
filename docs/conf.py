"""Sphinx configuration: the Markdown guides (MyST) and the API reference (autodoc).

Build with ``make docs`` or ``tox -e docs``; both run
``sphinx-build -n -W --keep-going -b html docs docs/_build/html``.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import warnings
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import make_refnode

logger = logging.getLogger(__name__)

# Importing the op modules resolves the device; on a machine without an accelerator
# gemshal says once that it falls back to the CPU. Expected here, and not a Sphinx
# warning: keep it out of the build's output.
warnings.filterwarnings("ignore", message="gemshal: no accelerator found",
                        category=RuntimeWarning)

ROOT = Path(__file__).resolve().parents[1]
# Document the working tree even where the project is not installed in editable mode.
sys.path.insert(0, str(ROOT))

project = "gemshal + gemsops"
author = "the gemshal authors"
copyright = "the gemshal authors"
release = version = importlib.import_module("gemshal").__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

root_doc = "index"
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
# docs/gpu/ holds raw outputs of GPU runs (.txt, .json) that the pages link to; they
# are not pages. Linked files are copied into the build as downloads.
exclude_patterns = ["_build", "gpu", "Thumbs.db", ".DS_Store"]

# MyST: anchors for headings, so that [text](page.md#a-heading) links resolve.
myst_heading_anchors = 4

# autodoc + napoleon (Google-style docstrings).
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True

# Nitpicky mode (-n) must resolve every cross-reference to our own names. Types of
# other packages cannot resolve: intersphinx would fetch their inventories from
# python.org / pytorch.org at build time, and the CI machine has no network. So the
# names of external packages (and of the standard library) are ignored here, and
# only those.
nitpick_ignore_regex = [
    ("py:.*", r"(torch|triton|attrs|attr|typing_extensions|numpy)(\..*)?"),
    ("py:.*", r"(collections|collections\.abc|typing|types|os|pathlib|contextlib|threading"
              r"|importlib|argparse|enum|re|tomllib|numbers|dataclasses|warnings|inspect"
              r"|concurrent)\..*"),
    # Private helper types of ours that appear in public signatures (a method's return
    # type); they are deliberately left out of the reference.
    ("py:class", r"(gemshal|gemsops)(\.\w+)*\._\w+"),
    # A TypeVar (the decorated function's type), not a documented name.
    ("py:class", r"gemsops\.declare\.F"),
]

html_theme = "alabaster"
html_title = "gemshal + gemsops"
html_static_path: list[str] = []


# --- the op functions page --------------------------------------------------------


def _op_names() -> list[str]:
    """The public op functions: ``gemsops.__all__`` less gemsops' base names.

    ``gemsops.__all__`` is computed on first use and imports the op modules (which
    resolves the device; on a machine without an accelerator that is the CPU and the
    Triton interpreter). The list follows the ops wherever their modules move.
    """
    import gemsops

    base = set(getattr(gemsops, "_BASE_ALL", ()))
    return [name for name in gemsops.__all__ if name not in base
            and callable(getattr(gemsops, name))]


class GemsopsOps(SphinxDirective):
    """``.. gemsops-ops::``: one ``autofunction`` per public op function, by name."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        try:
            names = _op_names()
        except Exception as exc:  # a broken op module: say which, fail the -W build
            logger.warning("gemsops-ops: cannot list gemsops.__all__: %s: %s",
                           type(exc).__name__, exc, location=self.get_location())
            return []
        lines = StringList()
        for name in names:
            lines.append(f".. autofunction:: gemsops.{name}", "<gemsops-ops>")
            lines.append("", "<gemsops-ops>")
        node = nodes.section()
        node.document = self.state.document
        self.state.nested_parse(lines, self.content_offset, node)
        return node.children


# --- references to our names, resolved as Python resolves them ----------------------
#
# A public name is documented once, where users import it (``gemshal.select``,
# ``gemshal.ConfigError``), while docstrings refer to it as their own module sees it
# (``gemshal.device.select``, or a bare ``ConfigError`` in gemshal.tune). A reference
# that Sphinx cannot resolve by name is looked up as a Python object from the
# referring docstring's module (and class), and resolved when that very object is
# documented under another name. References to undocumented names still warn.

_OURS = ("gemshal", "gemsops")
_documented: dict[int, tuple[str, str, str]] = {}


def _import(path: str) -> Any:
    """The object at the dotted ``path``: the longest importable module, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise LookupError(path)


def _by_identity(obj: Any) -> bool:
    # Small ints, strings and the like are shared objects: identity says nothing.
    return not isinstance(obj, int | float | str | bytes | type(None)) and not (
        isinstance(obj, tuple) and not obj)


def _documented_objects(env: BuildEnvironment) -> dict[int, tuple[str, str, str]]:
    if not _documented:
        for name, entry in env.get_domain("py").objects.items():  # type: ignore[attr-defined]
            if not name.startswith(_OURS) or entry.aliased:
                continue
            try:
                obj = _import(name)
            except Exception:
                continue
            if _by_identity(obj):
                _documented.setdefault(id(obj), (name, entry.docname, entry.node_id))
    return _documented


def _scopes(node: pending_xref) -> list[str]:
    module, cls = node.get("py:module"), node.get("py:class")
    scopes = []
    if module:
        if cls:
            scopes.append(f"{module}.{cls}")
            try:
                owner = _import(f"{module}.{cls}")
                scopes.append(f"{owner.__module__}.{owner.__qualname__}")
                scopes.append(owner.__module__)
            except Exception:
                pass
        scopes.append(module)
    return scopes


def _resolve_ours(app: Sphinx, env: BuildEnvironment, node: pending_xref,
                  contnode: nodes.TextElement) -> nodes.reference | None:
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    for path in [*(f"{scope}.{target}" for scope in _scopes(node)), target]:
        if not path.startswith(_OURS):
            continue
        try:
            obj = _import(path)
        except Exception:
            continue
        if inspect.ismodule(obj) or not _by_identity(obj):
            continue
        found = _documented_objects(env).get(id(obj))
        if found:
            name, docname, node_id = found
            return make_refnode(app.builder, node["refdoc"], docname, node_id, contnode, name)
    return None


def _public_bases(app: Sphinx, name: str, obj: Any, options: Any, bases: list[type]) -> None:
    """Show a private base class (``_Kernel``) as the bases it derives from."""
    i = 0
    while i < len(bases):
        if bases[i].__name__.startswith("_"):
            bases[i:i + 1] = [b for b in bases[i].__bases__ if b is not object]
        else:
            i += 1
    if not bases:
        bases.append(object)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("gemsops-ops", GemsopsOps)
    app.connect("missing-reference", _resolve_ours)
    app.connect("autodoc-process-bases", _public_bases)
    return {"parallel_read_safe": True}
