"""Sphinx configuration for the prefetch documentation.

Build with ``make docs`` (HTML, warnings as errors) and ``make doctest`` (runs
every example in these pages and in the docstrings).

Intersphinx links to the Python and PyTorch docs need the network. They are
on when ``PREFETCH_DOCS_INTERSPHINX=1``, off when it is ``0``, and otherwise on
only if both sites answer a TCP connection within about a second, so an
offline ``-W`` build passes and never hangs.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path

from sphinx.util import logging

logger = logging.getLogger(__name__)
DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))

import prefetch  # noqa: E402

project = "prefetch"
author = "prefetch developers"
copyright = "2026, prefetch developers"
release = prefetch.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
]

exclude_patterns = ["_build", "benchmarks/**", "Thumbs.db", ".DS_Store"]
templates_path: list[str] = []

# -- HTML -------------------------------------------------------------------

html_theme = "furo"
html_title = f"prefetch {release}"
html_static_path = ["_static"]
html_theme_options = {"navigation_with_keys": True}

# -- autodoc / napoleon -----------------------------------------------------

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_preserve_defaults = True
autodoc_default_options = {"members": True}
autoclass_content = "class"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# -- doctest ----------------------------------------------------------------

# Test plain ">>>" blocks too: that is how docstring examples pulled in by
# autodoc reach the doctest builder.
doctest_test_doctest_blocks = "default"
doctest_global_setup = """
import torch
from prefetch import (
    BackgroundIterator,
    BackgroundLoader,
    CudaPrefetcher,
    DeviceIterator,
    LoaderStats,
    Normalize,
)
from prefetch.compat import BackgroundGenerator, background

try:  # only for examples marked ":skipif: torchdata is None"
    import torchdata
except ImportError:
    torchdata = None
"""

# -- intersphinx (only with network) ----------------------------------------

INTERSPHINX_SITES = {
    "python": ("https://docs.python.org/3", "docs.python.org"),
    "torch": ("https://docs.pytorch.org/docs/stable", "docs.pytorch.org"),
}


def _reachable(hosts: list[str], timeout: float = 1.0) -> bool:
    """Return whether every host accepts a TCP connection on port 443.

    Runs in a daemon thread joined with a deadline, because name resolution
    ignores socket timeouts and could otherwise stall the build.
    """
    answered: list[str] = []

    def probe() -> None:
        for host in hosts:
            try:
                socket.create_connection((host, 443), timeout=timeout).close()
            except OSError:
                return
            answered.append(host)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout * len(hosts) + 0.5)
    return len(answered) == len(hosts)


def _want_intersphinx() -> bool:
    setting = os.environ.get("PREFETCH_DOCS_INTERSPHINX", "").strip()
    if setting in {"0", "1"}:
        return setting == "1"
    return _reachable([host for _, host in INTERSPHINX_SITES.values()])


if _want_intersphinx():
    extensions.append("sphinx.ext.intersphinx")
    intersphinx_mapping = {name: (url, None) for name, (url, _) in INTERSPHINX_SITES.items()}
    intersphinx_timeout = 5


# -- benchmarks page --------------------------------------------------------

RESULTS = "benchmarks/results.rst"


def _fallback_results(app: object, docname: str, source: list[str]) -> None:
    """Keep the benchmarks page building when the results file is missing."""
    if docname == "benchmarks" and not (DOCS / RESULTS).exists():
        source[0] = source[0].replace(
            f".. include:: {RESULTS}",
            ".. note::\n\n   No results yet: run ``make bench-docs`` to produce them.",
        )


# Iterators are created by iter(loader), never by hand: hide their constructor arguments.
HIDDEN_SIGNATURES = {"prefetch.BackgroundIterator", "prefetch.DeviceIterator"}


def _hide_signature(
    app: object, what: str, name: str, obj: object, options: object, signature: str, annotation: str
) -> tuple[str, str] | None:
    if what == "class" and name in HIDDEN_SIGNATURES:
        return "", annotation
    return None


def _check_api_coverage(app: object, env: object) -> None:
    """Warn (an error under -W) when a public name is missing from the API reference."""
    import prefetch.compat

    documented = env.get_domain("py").objects  # type: ignore[attr-defined]
    public = [f"prefetch.{name}" for name in prefetch.__all__]
    public += [f"prefetch.compat.{name}" for name in prefetch.compat.__all__]
    for name in public:
        if name not in documented:
            logger.warning("public name %s is missing from docs/api.rst", name)


def setup(app: object) -> None:
    app.connect("source-read", _fallback_results)  # type: ignore[attr-defined]
    app.connect("autodoc-process-signature", _hide_signature)  # type: ignore[attr-defined]
    app.connect("env-check-consistency", _check_api_coverage)  # type: ignore[attr-defined]
