"""The shape both self-tuning policies share: a setting, its epochs, its holds and changes.

A *control* is what the consumer of one loader asks about one setting of it:
the depth (:mod:`prefetch._threads.depth_policy`) or the fetch thread count
(:mod:`prefetch._threads.thread_policy`). :class:`Fixed` is a setting that
never changes; :class:`AdaptivePolicy` is the cycle both rule sets share:
start an epoch (its stats show the setting), adapt only the latest epoch,
change the setting with a reason, and record each kind of *hold* (a wait the
policy chose not to act on) once per epoch. Each rule set decides in its own
``observe``; nothing here decides anything.

A policy runs on the consumer's thread. It never sleeps and never touches a
thread, so scripted traces test it deterministically.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from prefetch._shared.arguments import check_count
from prefetch._shared.stats import DepthEvent, LoaderStats, PolicyEvent, ThreadEvent


@dataclasses.dataclass(frozen=True)
class Setting:
    """Where a setting shows in an epoch's :class:`~prefetch.LoaderStats`, and its event type."""

    current: str
    peak: str
    events: str
    event: type[PolicyEvent]


DEPTH = Setting("depth", "peak_depth", "depth_events", DepthEvent)
"""``BackgroundLoader(depth=...)``."""
THREADS = Setting("fetch_threads", "peak_fetch_threads", "thread_events", ThreadEvent)
"""``BackgroundLoader(fetch_threads=...)``."""


class Control(Protocol):
    """What the consumer of one loader asks of one setting (see the module)."""

    value: int
    maximum: int
    adaptive: bool

    @property
    def observe(self) -> Callable[..., int | None]:
        """Take hand-offs into account (each rule set's own figures); return a new value or None."""

    def start_epoch(self, stats: LoaderStats) -> None:
        """Begin an epoch whose stats receive the setting (and its changes)."""

    def drives(self, stats: LoaderStats) -> bool:
        """Whether ``stats`` belong to the epoch this control adapts."""

    def first_reads(self) -> int | None:
        """Reads after which to hear of them (:meth:`observe_reads`), or ``None``: never."""

    def observe_reads(
        self, *, reads: int, busy_seconds: float, cpu_seconds: float, now: float
    ) -> int | None:
        """Take the reads :meth:`first_reads` asked for into account; return a new value or None.

        ``reads``, ``busy_seconds`` and ``cpu_seconds`` are the epoch's totals so
        far; ``now`` is ``time.perf_counter()`` (the time of any change it records).
        """


class NoReads:
    """A control that hears of no reads: what :class:`Fixed` and most rule sets do."""

    def first_reads(self) -> int | None:
        """Never: a rule set that sizes from the first reads overrides this."""
        return None

    def observe_reads(
        self, *, reads: int, busy_seconds: float, cpu_seconds: float, now: float
    ) -> int | None:
        """Ignore them: the setting stays."""
        return None


class Fixed(NoReads):
    """A setting that never changes, behind :class:`Control`.

    Example:
        >>> control = Fixed(DEPTH, 4)
        >>> stats = LoaderStats()
        >>> control.start_epoch(stats)
        >>> stats.depth, control.maximum, control.adaptive, control.drives(stats)
        (4, 4, False, False)
    """

    adaptive = False

    def __init__(self, setting: Setting, value: int) -> None:
        self.setting = setting
        self.value = self.maximum = check_count(value, setting.current, type(self).__name__)

    def start_epoch(self, stats: LoaderStats) -> None:
        """Record the setting in the epoch's stats."""
        setattr(stats, self.setting.current, self.value)
        setattr(stats, self.setting.peak, self.value)

    def drives(self, stats: LoaderStats) -> bool:
        """Never: a fixed setting is not adapted (the consumer does not report to it)."""
        return False

    def observe(self, **report: Any) -> int | None:
        """Ignore the report: the setting stays."""
        return None


class AdaptivePolicy(NoReads):
    """The cycle of a self-tuning setting; a subclass adds its rules and ``observe``.

    Args:
        value: The first value.
        maximum: The most it may reach.
    """

    adaptive = True
    setting: ClassVar[Setting]

    def __init__(self, value: int, maximum: int) -> None:
        self.value = value
        self.maximum = maximum
        self._stats = LoaderStats()
        self._now = 0.0  # the clock at the latest report
        self._items = 0  # items handed over in the epoch at the latest report
        self._holds_recorded: set[str] = set()

    def drives(self, stats: LoaderStats) -> bool:
        """Whether ``stats`` belong to the epoch this policy adapts (the latest one)."""
        return self._stats is stats

    def start_epoch(self, stats: LoaderStats) -> None:
        """Begin an epoch whose stats receive the setting and its changes."""
        self._stats = stats
        setattr(stats, self.setting.current, self.value)
        setattr(stats, self.setting.peak, self.value)
        self._holds_recorded = set()

    def _record_hold(self, kind: str, reason: str) -> None:
        """Record, once per epoch and kind, why a wait did not change the setting."""
        if kind not in self._holds_recorded:
            self._holds_recorded.add(kind)
            self._record_event(self.value, reason)

    def _change(self, new: int, reason: str) -> int:
        """Change the setting to ``new`` for ``reason``; return ``new``."""
        self._record_event(new, reason)
        self.value = new
        stats, setting = self._stats, self.setting
        setattr(stats, setting.current, new)
        setattr(stats, setting.peak, max(getattr(stats, setting.peak) or 0, new))
        return new

    def _record_event(self, new: int, reason: str) -> None:
        stats = self._stats
        seconds = self._now - stats.started if stats.started is not None else 0.0
        event = self.setting.event(self._items, seconds, self.value, new, reason)
        getattr(stats, self.setting.events).append(event)
