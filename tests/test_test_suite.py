"""The test suite itself: every test asserts something, and no assertion is true by its form.

Read from the source (``ast``), never run: a test function (``test_*`` in
``tests/`` and ``tests/gpu/``) must contain an ``assert``, a
``pytest.raises``/``pytest.warns`` block or a ``pytest.fail``, or call a
helper of :data:`ASSERTING_HELPERS`, each checked to contain an assertion
itself. An assertion is *trivially true* when its form decides it: a truthy
constant, a non-empty tuple (``assert (x, "message")``), an ``or`` with a
truthy constant, a value compared with itself, or a length compared with 0
(``len(x) >= 0``), or one an earlier check already decided (``caught.value
is not None`` after ``pytest.raises``). The controls plant each kind and check
it is found. ``[tool.mutmut]`` (``make mutation``) must name files that
exist and load ``tests/mutation_harness.py``. Last, no helper reads another
thread's frames without checking that the GIL is on (3.13t crashed doing it).
"""

from __future__ import annotations

import ast
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
TEST_FILES = sorted([*TESTS.glob("test_*.py"), *TESTS.glob("gpu/test_*.py")])
HELPER_FILES = sorted(TESTS.glob("**/*.py"))

ASSERTING_HELPERS = {
    # tests/liveness.py: fail (pytest.fail) when the awaited state never comes
    "wait_for",
    "wait_went_ahead",
    "wait_read_ahead",
    "take",
    "consume",
    # tests/parallel.py and the files that define them
    "assert_same",
    "assert_same_batches",
    "check_bound",
    "check_resume",
    "run_concurrently",
    "assert_session_empty",
    "check_epoch",
    # tests/same_training.py: names the first step where plain and wrapped differ
    "assert_same_steps",
}
"""Functions a test may leave its assertions to, called by name; each must assert (checked)."""

ASSERTING_METHODS = {"_consume", "resume_as_plain"}
"""Methods of a test class a test may leave its assertions to (``self._consume(...)``)."""

ALLOWED_PLAIN_CALLS = {"raises", "warns", "fail", "deprecated_call"}
"""``pytest.<name>`` calls that assert."""


def collected_tests(tree: ast.Module) -> Iterator[ast.FunctionDef]:
    """The ``test_*`` functions of a module: at its top level and in its ``Test*`` classes."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            yield node
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test_"):
                    yield item


def called_name(call: ast.Call) -> str | None:
    """The name a call calls: ``f`` for ``f(...)``, ``m`` for ``x.m(...)``."""
    function = call.func
    if isinstance(function, ast.Name):
        return function.id
    if isinstance(function, ast.Attribute):
        return function.attr
    return None


def calls_a_helper(call: ast.Call, functions: set[str], methods: set[str]) -> bool:
    """Whether ``call`` is ``f(...)`` for ``f`` in ``functions`` or ``self.m(...)`` for a method.

    ``reader.wait_for(...)`` is not ``wait_for(...)``: another object's method of
    the same name need not assert.
    """
    function = call.func
    if isinstance(function, ast.Name):
        return function.id in functions
    return (
        isinstance(function, ast.Attribute)
        and isinstance(function.value, ast.Name)
        and function.value.id in {"self", "cls"}
        and function.attr in methods
    )


def is_pytest_check(call: ast.Call) -> bool:
    """Whether ``call`` is ``pytest.raises(...)``, ``pytest.warns(...)``, ``pytest.fail(...)``."""
    function = call.func
    return (
        isinstance(function, ast.Attribute)
        and isinstance(function.value, ast.Name)
        and function.value.id == "pytest"
        and function.attr in ALLOWED_PLAIN_CALLS
    )


def raises_assertion_error(node: ast.AST) -> bool:
    """Whether ``node`` is ``raise AssertionError(...)``."""
    if not isinstance(node, ast.Raise) or node.exc is None:
        return False
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return isinstance(exc, ast.Name) and exc.id == "AssertionError"


def asserts_itself(function: ast.AST) -> bool:
    """Whether ``function`` contains an assert, a pytest check or ``raise AssertionError``."""
    for node in ast.walk(function):
        if isinstance(node, ast.Assert) or raises_assertion_error(node):
            return True
        if isinstance(node, ast.Call) and is_pytest_check(node):
            return True
    return False


def asserts(
    function: ast.FunctionDef,
    functions: set[str] = ASSERTING_HELPERS,
    methods: set[str] = ASSERTING_METHODS,
) -> bool:
    """Whether a test asserts: by itself, or through a listed helper."""
    if asserts_itself(function):
        return True
    return any(
        isinstance(node, ast.Call) and calls_a_helper(node, functions, methods)
        for node in ast.walk(function)
    )


def truthy_constant(node: ast.expr) -> bool:
    """Whether ``node`` is a constant (or a non-empty literal tuple) that is always true."""
    if isinstance(node, ast.Constant):
        return bool(node.value)
    return isinstance(node, ast.Tuple) and bool(node.elts)


def is_len_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len"


def zero(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0 and not isinstance(node.value, bool)


def trivially_true(test: ast.expr) -> str | None:
    """Why the asserted expression ``test`` cannot be false, or None if it can."""
    if truthy_constant(test):
        return "a constant (or a non-empty tuple) is always true"
    if (
        isinstance(test, ast.BoolOp)
        and isinstance(test.op, ast.Or)
        and any(truthy_constant(value) for value in test.values)
    ):
        return "an `or` with a true constant"
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(op, ast.Eq | ast.Is | ast.LtE | ast.GtE) and ast.dump(left) == ast.dump(
            right
        ):
            return "a value compared with itself"
        if isinstance(op, ast.GtE) and is_len_call(left) and zero(right):
            return "a length is never negative"
        if isinstance(op, ast.LtE) and zero(left) and is_len_call(right):
            return "a length is never negative"
    return None


def raises_targets(function: ast.AST) -> set[str]:
    """Names bound by ``with pytest.raises(...) as name`` in ``function``."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                if (
                    isinstance(call, ast.Call)
                    and is_pytest_check(call)
                    and called_name(call) == "raises"
                    and isinstance(item.optional_vars, ast.Name)
                ):
                    names.add(item.optional_vars.id)
    return names


def conjuncts(test: ast.expr) -> list[ast.expr]:
    """The parts of an ``and`` (or the expression itself)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [part for value in test.values for part in conjuncts(value)]
    return [test]


def not_none_of(test: ast.expr) -> ast.expr | None:
    """``x`` for ``x is not None``, else None."""
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.IsNot)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    ):
        return test.left
    return None


def isinstance_of(test: ast.expr) -> str | None:
    """``x`` for ``isinstance(x, ...)`` on a plain name, else None."""
    if (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == "isinstance"
        and test.args
        and isinstance(test.args[0], ast.Name)
    ):
        return test.args[0].id
    return None


def settled_by_earlier_checks(function: ast.AST) -> Iterator[tuple[int, str]]:
    """Asserts that a pytest.raises block or an earlier assert already decided."""
    raised = raises_targets(function)
    known: set[str] = set()  # names an earlier assert showed to be instances
    asserts = sorted(
        (node for node in ast.walk(function) if isinstance(node, ast.Assert)),
        key=lambda node: node.lineno,
    )
    for node in asserts:
        for part in conjuncts(node.test):
            subject = not_none_of(part)
            if subject is None:
                subject = part  # a bare `assert caught.value`
            if (
                isinstance(subject, ast.Attribute)
                and subject.attr in {"value", "type"}
                and isinstance(subject.value, ast.Name)
                and subject.value.id in raised
            ):
                yield node.lineno, "pytest.raises already ensured an error was caught"
            elif isinstance(subject, ast.Name) and subject.id in known and subject is not part:
                yield node.lineno, "an earlier assert showed it is an instance"
        known.update(name for part in conjuncts(node.test) if (name := isinstance_of(part)))


def trivial_asserts(tree: ast.AST) -> list[tuple[int, str]]:
    """Every assert of ``tree`` that cannot fail: its line and why, in line order."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            why = trivially_true(node.test)
            if why is not None:
                found.append((node.lineno, why))
        elif isinstance(node, ast.FunctionDef):
            found.extend(settled_by_earlier_checks(node))
    return sorted(found)


def definitions(name: str, *, method: bool) -> list[tuple[Path, ast.FunctionDef]]:
    """Every module-level function (or, with ``method``, class method) ``name`` in tests/."""
    found = []
    for path in HELPER_FILES:
        for node in ast.parse(path.read_text()).body:
            scope = node.body if method and isinstance(node, ast.ClassDef) else [node]
            if not method and isinstance(node, ast.ClassDef):
                continue
            found.extend(
                (path, item)
                for item in scope
                if isinstance(item, ast.FunctionDef) and item.name == name
            )
    return found


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


class TestEveryTestAsserts:
    def test_the_suite_is_found(self) -> None:
        """The check reads the real suite: many files, many tests (never a vacuous pass)."""
        assert len(TEST_FILES) >= 50
        assert sum(len(list(collected_tests(parse(path)))) for path in TEST_FILES) >= 500

    @pytest.mark.parametrize("path", TEST_FILES, ids=lambda path: str(path.relative_to(TESTS)))
    def test_every_test_asserts(self, path: Path) -> None:
        """Each test function asserts, directly or through a listed helper."""
        silent = [f.name for f in collected_tests(parse(path)) if not asserts(f)]
        assert silent == [], f"{path.name}: tests that assert nothing: {silent}"

    @pytest.mark.parametrize("path", TEST_FILES, ids=lambda path: str(path.relative_to(TESTS)))
    def test_no_assert_is_true_by_its_form(self, path: Path) -> None:
        """No assert in a test file is a constant, a self-comparison or len(x) >= 0."""
        found = trivial_asserts(parse(path))
        assert found == [], f"{path.name}: assertions that cannot fail: {found}"

    @pytest.mark.parametrize(
        ("name", "method"),
        [(name, False) for name in sorted(ASSERTING_HELPERS)]
        + [(name, True) for name in sorted(ASSERTING_METHODS)],
    )
    def test_each_listed_helper_asserts(self, name: str, method: bool) -> None:
        """A listed helper exists in tests/ and every definition of it asserts."""
        found = definitions(name, method=method)
        assert found, f"{name} is listed as asserting but defined nowhere in tests/"
        for path, function in found:
            assert asserts(function), f"{path.name}: {name} contains no assertion"


PLANTED = textwrap.dedent(
    """
    import pytest

    def test_runs_only():
        list(range(3))

    def test_calls_an_unlisted_helper():
        helper()

    def test_calls_a_method_named_like_a_helper(reader):
        reader.wait_for("ready", 5)

    class TestPlanted:
        def test_true_constant(self):
            assert True

        def test_message_tuple(self, x):
            assert (x == 1, "x is one")

        def test_or_true(self, x):
            assert x == 1 or True

        def test_self_comparison(self, x):
            assert x.value == x.value

        def test_length(self, x):
            assert len(x) >= 0

        def test_caught_value(self):
            with pytest.raises(ValueError) as caught:
                int("x")
            assert caught.value is not None

        def test_after_isinstance(self, raised):
            assert isinstance(raised, ValueError)
            assert raised is not None

        def test_fine(self, x):
            assert x == 1

        def test_raises_is_fine(self):
            with pytest.raises(ValueError):
                int("x")

        def test_through_a_helper(self):
            wait_for(lambda: True, "nothing")

    def helper():
        return 1
    """
)


class TestTheCheckFindsPlantedOffenders:
    """Controls: the check is not vacuous."""

    def test_a_test_that_asserts_nothing_is_found(self) -> None:
        """A test that only runs code, or calls a helper not known to assert, is reported."""
        tree = ast.parse(PLANTED)
        silent = [f.name for f in collected_tests(tree) if not asserts(f)]
        assert silent == [
            "test_runs_only",
            "test_calls_an_unlisted_helper",
            "test_calls_a_method_named_like_a_helper",
        ]

    def test_assertions_that_cannot_fail_are_found(self) -> None:
        """Each planted trivially-true assert is reported, with its reason; real ones are not."""
        found = [why for _, why in trivial_asserts(ast.parse(PLANTED))]
        assert found == [
            "a constant (or a non-empty tuple) is always true",
            "a constant (or a non-empty tuple) is always true",
            "an `or` with a true constant",
            "a value compared with itself",
            "a length is never negative",
            "pytest.raises already ensured an error was caught",
            "an earlier assert showed it is an instance",
        ]

    def test_a_listed_helper_without_an_assert_is_found(self) -> None:
        """A helper listed as asserting but containing no assertion fails its check."""
        (helper,) = [
            node
            for node in ast.walk(ast.parse(PLANTED))
            if isinstance(node, ast.FunctionDef) and node.name == "helper"
        ]
        assert not asserts(helper)


class TestMutationConfig:
    """``[tool.mutmut]`` in pyproject.toml names what exists (``make mutation`` reads it)."""

    CONFIG = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["mutmut"]

    @pytest.mark.parametrize("key", ["only_mutate", "do_not_mutate"])
    def test_every_pattern_names_a_module(self, key: str) -> None:
        """Each pattern matches a file: a module renamed or removed is noticed here."""
        root = TESTS.parent
        missing = [pattern for pattern in self.CONFIG[key] if not list(root.glob(pattern))]
        assert missing == [], f"[tool.mutmut] {key} names no file: {missing}"

    def test_every_selected_test_file_exists(self) -> None:
        """The test files mutmut runs exist."""
        selection = self.CONFIG["pytest_add_cli_args_test_selection"]
        files = [name.split("::")[0] for name in selection]  # a class or test: its file
        missing = [name for name in files if not (TESTS.parent / name).is_file()]
        assert selection and missing == []

    def test_the_harness_is_loaded(self) -> None:
        """mutmut's pytest runs load tests/mutation_harness.py (without it, stats fail)."""
        arguments = self.CONFIG["pytest_add_cli_args"]
        assert ["-p", "tests.mutation_harness"] in [
            arguments[i : i + 2] for i in range(len(arguments) - 1)
        ]
        assert (TESTS / "mutation_harness.py").is_file()


def unguarded_frame_reads(tree: ast.Module) -> list[str]:
    """Functions that call ``sys._current_frames()`` without asking ``gil_enabled()`` first."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names = {
                name.attr if isinstance(name, ast.Attribute) else name.id
                for name in ast.walk(node)
                if isinstance(name, ast.Attribute | ast.Name)
            }
            if "_current_frames" in names and "gil_enabled" not in names:
                found.append(node.name)
    return found


class TestNoFrameReadsWithoutTheGil:
    """No helper reads another thread's frames unless the GIL is on.

    Walking a running thread's frames (``sys._current_frames()``, ``f_back``) from
    another thread crashed 3.13t with the GIL off (SIGSEGV, once in about 190 runs of
    ``TestInterruptKept``): a test waits for an event a spy sets, or reads the lock or
    queue the other thread waits on (docs/development.rst, "The test suite").
    """

    @pytest.mark.parametrize("path", HELPER_FILES, ids=lambda path: str(path.relative_to(TESTS)))
    def test_frames_are_read_only_with_the_gil(self, path: Path) -> None:
        """A function that reads other threads' frames checks ``gil_enabled()``."""
        found = unguarded_frame_reads(parse(path))
        assert found == [], f"{path.name}: frames read without the GIL check: {found}"

    def test_a_planted_read_is_found(self) -> None:
        """The check finds an unguarded read, and passes a guarded one."""
        planted = textwrap.dedent(
            """
            import sys
            def where(thread):
                return sys._current_frames().get(thread.ident)
            def guarded(thread):
                if not gil_enabled():
                    return None
                return sys._current_frames().get(thread.ident)
            """
        )
        assert unguarded_frame_reads(ast.parse(planted)) == ["where"]
