"""The docs pages' examples run when copied as shown: no hidden setup supplies a name.

``make doctest`` runs them with the Sphinx configuration's global setup, which
imports the package for the docstrings; here each page runs top to bottom in
an empty namespace, as a reader pasting its examples in order would.
"""

from __future__ import annotations

import doctest
import textwrap
from pathlib import Path

import pytest

from .torch_features import ALL_THREADS_REASON, profiles_all_threads

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = ["quickstart.rst", "guide.rst", "migration.rst", "diagnosing.rst"]
FLAGS = doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL | doctest.DONT_ACCEPT_TRUE_FOR_1


def page_blocks(text: str, name: str) -> list[tuple[str, str]]:
    """Return ``(kind, source)`` of every ``doctest`` and ``testcode`` block, in order."""
    lines = text.splitlines()
    blocks: list[tuple[str, str]] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if line.startswith(".. testsetup::"):
            pytest.fail(f"{name}: a hidden testsetup block supplies names to its examples")
        kind = "doctest" if line.startswith(".. doctest::") else None
        kind = "testcode" if line.startswith(".. testcode::") else kind
        if kind is None:
            continue
        body: list[str] = []
        while index < len(lines) and (not lines[index].strip() or lines[index][0] == " "):
            body.append(lines[index])
            index += 1
        source = textwrap.dedent("\n".join(b for b in body if not b.strip().startswith(":")))
        blocks.append((kind, source))
    return blocks


class TestDocsPages:
    """Each guide page's examples run in order in an empty namespace."""

    @pytest.mark.timeout(120)
    @pytest.mark.parametrize("page", PAGES)
    def test_examples_run_as_shown(self, page: str) -> None:
        """Every example of the page passes with only the imports the page shows."""
        blocks = page_blocks((DOCS / page).read_text(), page)
        assert blocks, f"{page}: no examples found"
        namespace: dict[str, object] = {"__name__": "__docs__"}
        parser = doctest.DocTestParser()
        runner = doctest.DocTestRunner(optionflags=FLAGS)
        output: list[str] = []
        left_out = 0
        for kind, source in blocks:
            if "profile_all_threads" in source and not profiles_all_threads():
                left_out += 1  # the profiler recipe, on a torch whose profiler cannot run it
                continue
            if kind == "testcode":
                exec(compile(source, page, "exec"), namespace)
                continue
            test = parser.get_doctest(source, namespace, page, str(DOCS / page), 0)
            runner.run(test, out=output.append, clear_globs=False)
            namespace = test.globs  # DocTest copies the namespace it is given
        assert runner.failures == 0, "".join(output)
        if left_out:
            passed = f"{page}: the other examples passed, {left_out} left out"
            pytest.skip(f"{passed}: {ALL_THREADS_REASON}")
