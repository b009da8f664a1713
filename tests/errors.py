"""Exceptions of every awkward kind, for the tests that inject source errors."""

from __future__ import annotations


class KwOnlyError(Exception):
    """An exception whose constructor needs a keyword-only argument."""

    def __init__(self, *, code: int) -> None:
        super().__init__(f"code {code}")
        self.code = code


class NoSuperError(Exception):
    """An exception whose ``__init__`` never calls ``super().__init__``."""

    def __init__(self, a: int, b: int) -> None:
        self.total = a + b


class CustomBaseError(BaseException):
    """A ``BaseException`` that is not an ``Exception``."""


def make_errors() -> dict[str, BaseException]:
    """Return one fresh instance of every exception kind the fault tests inject."""
    return {
        "ValueError": ValueError("boom"),
        "KeyboardInterrupt": KeyboardInterrupt(),
        "SystemExit": SystemExit(3),
        "CustomBaseError": CustomBaseError("custom"),
        "KwOnlyError": KwOnlyError(code=7),
        "NoSuperError": NoSuperError(1, 2),
        "StopIteration-in-RuntimeError": RuntimeError("wraps", StopIteration()),
    }
