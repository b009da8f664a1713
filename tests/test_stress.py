"""Soak: many epochs of mixed faults leak no thread, worker or memory; live batches stay bounded.

By default a reduced run suitable for CI (40 epochs, a few seconds); with
``PREFETCH_STRESS=full`` (``make stress``) several hundred epochs.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import random
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from prefetch import BackgroundLoader, CudaPrefetcher
from prefetch._shared.wrapper import one_iterator_reason

from .errors import make_errors
from .liveness import wait_read_ahead
from .processes import (
    live_child_pids,
    os_thread_count,
    prefetch_threads,
    rss_mb,
    settle,
    wait_until,
)
from .sources import FailingIterable, Tracked, failing_gen

FULL = os.environ.get("PREFETCH_STRESS", "").lower() == "full"
EPOCHS = 3000 if FULL else 150
SOAK_TIMEOUT = 1800 if FULL else 120
SEED = int(os.environ.get("PREFETCH_STRESS_SEED", "20260601"))
RSS_BOUND_MB = 200


class IndexDataset(Dataset[int]):
    """``dataset[i] == i``; a negative index raises (a poisoned sampler entry)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int) -> int:
        if index < 0:
            raise ValueError(f"poisoned index {index}")
        if self.delay:
            time.sleep(self.delay)  # keep the producer inside next(source), where races live
        return index


@dataclass
class Config:
    """One way of building a loader, and how to read an item and inject an error."""

    name: str
    build: Callable[[], Any]
    items: int
    dataloader: bool = False
    poison: list[int] = field(default_factory=list)  # the sampler list (DataLoader configs)
    source: FailingIterable | None = None
    keep: Any = None  # a loader reused across epochs (persistent workers)


@dataclass
class Tally:
    """What the soak did, for the report."""

    epochs: int = 0
    actions: dict[str, int] = field(default_factory=dict)
    configs: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    items: int = 0

    def count(self, table: dict[str, int], key: str) -> None:
        """Add one to ``table[key]``."""
        table[key] = table.get(key, 0) + 1


def batch_key(batch: Any) -> tuple[int, ...] | int:
    """Turn an item (int or tensor batch) into something comparable."""
    if isinstance(batch, torch.Tensor):
        return tuple(int(v) for v in batch.reshape(-1))
    return int(batch)


def make_configs(rng: random.Random) -> dict[str, Config]:
    """Build the loader configurations the soak draws from."""
    configs: dict[str, Config] = {}

    list_source = FailingIterable(list(range(30)))
    configs["background-list"] = Config(
        "background-list",
        lambda: BackgroundLoader(list_source, depth=rng.randint(1, 4)),
        30,
        source=list_source,
    )
    gen_holder = FailingIterable(list(range(25)))
    configs["background-generator"] = Config(
        "background-generator",
        # A fresh single-use generator each epoch (the BackgroundGenerator use case).
        lambda: BackgroundLoader(
            failing_gen(gen_holder.items, gen_holder.fail_at, gen_holder.error),
            depth=rng.randint(1, 4),
        ),
        25,
        source=gen_holder,
    )
    stacked_source = FailingIterable([torch.tensor([i, -i]) for i in range(20)])
    configs["stacked"] = Config(
        "stacked",
        lambda: CudaPrefetcher(
            BackgroundLoader(stacked_source, depth=rng.randint(1, 3)),
            device="cpu",
            depth=rng.randint(1, 3),
        ),
        20,
        source=stacked_source,
    )

    sampler: list[int] = list(range(16))
    configs["dataloader-2-workers"] = Config(
        "dataloader-2-workers",
        lambda: BackgroundLoader(
            DataLoader(IndexDataset(), batch_size=2, sampler=sampler, num_workers=2),
            depth=rng.randint(1, 4),
        ),
        8,
        dataloader=True,
        poison=sampler,
    )
    persistent_sampler: list[int] = list(range(16))
    persistent = BackgroundLoader(
        DataLoader(
            IndexDataset(delay=0.001),
            batch_size=2,
            sampler=persistent_sampler,
            num_workers=2,
            persistent_workers=True,
        ),
        depth=3,
    )
    configs["dataloader-persistent"] = Config(
        "dataloader-persistent",
        lambda: persistent,
        8,
        dataloader=True,
        poison=persistent_sampler,
        keep=persistent,
    )
    stacked_sampler: list[int] = list(range(16))
    stacked_persistent = CudaPrefetcher(
        BackgroundLoader(
            DataLoader(
                IndexDataset(delay=0.001),
                batch_size=2,
                sampler=stacked_sampler,
                num_workers=2,
                persistent_workers=True,
            ),
            depth=2,
        ),
        device="cpu",
        depth=2,
    )
    configs["stacked-dataloader-persistent"] = Config(
        "stacked-dataloader-persistent",
        lambda: stacked_persistent,
        8,
        dataloader=True,
        poison=stacked_sampler,
        keep=stacked_persistent,
    )
    return configs


def expected_items(config: Config) -> list[Any]:
    """The exact sequence a full, fault-free epoch of ``config`` delivers."""
    if config.dataloader:
        return [(2 * b, 2 * b + 1) for b in range(config.items)]
    assert config.source is not None
    return [batch_key(item) for item in config.source.items]


def arm_error(config: Config, position: int, rng: random.Random) -> tuple[type, Any]:
    """Make the next epoch of ``config`` fail at item ``position``; return (type, object)."""
    if config.dataloader:
        config.poison.insert(2 * position, -1)  # the whole batch ``position`` fails
        return ValueError, None
    assert config.source is not None
    error = make_errors()[rng.choice(sorted(make_errors()))]
    config.source.fail_at = position
    config.source.error = error
    return type(error), error


def disarm(config: Config) -> None:
    """Remove any injected error from ``config``."""
    if config.dataloader:
        while -1 in config.poison:
            config.poison.remove(-1)
    elif config.source is not None:
        config.source.fail_at = None
        config.source.error = None


def run_epoch(config: Config, rng: random.Random, tally: Tally) -> None:
    """Run one randomly chosen kind of epoch on ``config`` and check what it delivered."""
    full = expected_items(config)
    action = rng.choice(["full", "full", "break", "error", "close", "gc", "restart"])
    tally.count(tally.actions, action)
    tally.count(tally.configs, config.name)
    stop_at = rng.randrange(len(full))
    got: list[Any] = []
    if action == "error":
        error_type, error_object = arm_error(config, stop_at, rng)  # before a generator is made
    loader = config.build()
    if action == "error":
        iterator = iter(loader)
        raised: BaseException | None = None
        try:
            for item in iterator:
                got.append(batch_key(item))
        except BaseException as error:
            raised = error
        finally:
            disarm(config)
        assert got == full[:stop_at], (config.name, action, got)
        assert isinstance(raised, error_type), (config.name, raised)
        if error_object is not None:
            assert raised is error_object
        tally.count(tally.errors, type(raised).__name__)
        del raised
    elif action == "full":
        got = [batch_key(item) for item in loader]
        assert got == full, (config.name, action, got)
    elif action == "break":
        for item in loader:
            got.append(batch_key(item))
            if len(got) > stop_at:
                break
        assert got == full[: stop_at + 1], (config.name, action, got)
    elif action == "close":
        for item in loader:
            got.append(batch_key(item))
            if len(got) > stop_at:
                loader.close()
        assert got == full[: stop_at + 1], (config.name, action, got)
    elif action == "gc":
        iterator = iter(loader)
        for _ in range(stop_at):
            got.append(batch_key(next(iterator)))
        del iterator  # abandoned without close(): the finalizer stops the thread
        assert got == full[:stop_at], (config.name, action, got)
    elif action == "restart":
        # Start the next epoch on the same loader while holding the old iterator: the
        # new one is complete; the old one goes on where the loader allows two
        # iterators, and says why it cannot where it does not (persistent workers).
        old = iter(loader)
        for _ in range(stop_at):
            got.append(batch_key(next(old)))
        assert got == full[:stop_at]
        if config.name == "background-generator":
            return  # a generator source cannot be iterated twice
        shared = one_iterator_reason(loader) is not None
        got = [batch_key(item) for item in loader]
        assert got == full, (config.name, action, got)
        if shared:
            with pytest.raises(RuntimeError, match="a newer iter"):
                next(old)
        else:
            rest = [batch_key(item) for item in old]
            assert rest == full[stop_at:], (config.name, action, rest)
    tally.items += len(got)
    tally.epochs += 1


class TestSoak:
    """Hundreds of mixed epochs leave no thread, no process and no memory behind."""

    @pytest.mark.slow
    @pytest.mark.timeout(SOAK_TIMEOUT)
    def test_mixed_epochs(self) -> None:
        """Random full/broken/failing/closed/abandoned epochs: exact items, then nothing leaks."""
        rng = random.Random(SEED)
        configs = make_configs(rng)
        names = sorted(configs)
        warmup = max(len(names), EPOCHS // 10)
        rss_start = rss_mb()
        rss_after_warmup = rss_start
        started = time.monotonic()
        tally = Tally()
        for epoch in range(EPOCHS + warmup):
            # Warm up each configuration once (workers, allocator), then draw at random.
            name = names[epoch] if epoch < len(names) else rng.choice(names)
            run_epoch(configs[name], rng, tally)
            if epoch == warmup - 1:
                gc.collect()
                rss_after_warmup = rss_mb()
        for config in configs.values():
            if config.keep is not None:
                config.keep.close()
        del configs, config
        gc.collect()
        threads, children = settle(15.0)
        os_threads = os_thread_count()
        rss_end = rss_mb()
        growth = rss_end - rss_after_warmup
        print(
            f"\nsoak: {tally.epochs} epochs in {time.monotonic() - started:.1f} s "
            f"(seed {SEED}, {'full' if FULL else 'CI'} mode), {tally.items} items; "
            f"actions {tally.actions}; configs {tally.configs}; errors {tally.errors}; "
            f"RSS {rss_start:.0f} -> {rss_after_warmup:.0f} (after warm-up) -> {rss_end:.0f} MB "
            f"(growth {growth:+.1f} MB); OS threads at end {os_threads}; "
            f"prefetch threads {threads}; child processes {children}"
        )
        assert threads == []
        assert children == []
        assert multiprocessing.active_children() == []
        assert growth < RSS_BOUND_MB

    @pytest.mark.slow
    @pytest.mark.timeout(SOAK_TIMEOUT)
    def test_os_threads_return_to_baseline(self) -> None:
        """After many epochs of thread-only sources, /proc/self/task is back to its start."""
        gc.collect()
        settle(5.0)
        before = os_thread_count()
        rng = random.Random(SEED + 1)
        for _ in range(EPOCHS * 5):
            loader = CudaPrefetcher(
                BackgroundLoader(range(rng.randint(0, 40)), depth=rng.randint(1, 5)),
                device="cpu",
                depth=rng.randint(1, 3),
            )
            iterator = iter(loader)
            for _ in range(rng.randint(0, 45)):
                if next(iterator, None) is None:
                    break
            if rng.random() < 0.5:
                iterator.close()
            del iterator, loader
        assert settle(5.0) == ([], [])
        # A thread is gone from threading.enumerate() a moment before its OS thread has
        # exited: wait for /proc to agree (a thread that stays still fails here).
        assert wait_until(lambda: os_thread_count() <= before, 5.0), (before, os_thread_count())
        assert not live_child_pids()


# --------------------------------------------------------------------------- live batches


def tracked_source(count: int, refs: list[weakref.ref[Any]], tensors: bool) -> Iterator[Any]:
    """Yield ``count`` fresh weak-referenceable batches, recording a weakref to each."""

    def make(index: int) -> Any:
        batch = torch.full((8,), float(index)) if tensors else Tracked(index)
        refs.append(weakref.ref(batch))
        return batch

    for index in range(count):
        yield make(index)  # no local keeps the yielded batch alive


def count_live(refs: list[weakref.ref[Any]]) -> int:
    """How many of the recorded batches are still alive."""
    return sum(ref() is not None for ref in refs)


class TestLiveBatches:
    """At any moment at most depth + 2 batches are alive because of the wrapper."""

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("depth", [1, 2, 4, 8])
    @pytest.mark.parametrize("tensors", [False, True], ids=["slots", "tensors"])
    def test_background_loader(self, depth: int, tensors: bool) -> None:
        """BackgroundLoader(depth) never keeps more than depth + 2 batches alive."""
        refs: list[weakref.ref[Any]] = []
        loader = BackgroundLoader(tracked_source(40, refs, tensors), depth=depth)
        peak = self._consume(loader, refs, bound=depth + 2)
        print(f"BackgroundLoader depth={depth}: peak {peak} live batches (bound {depth + 2})")

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("depth", [1, 2, 4])
    def test_cuda_prefetcher_cpu_path(self, depth: int) -> None:
        """CudaPrefetcher(depth) on the CPU path never keeps more than depth + 2 alive."""
        refs: list[weakref.ref[Any]] = []
        loader = CudaPrefetcher(tracked_source(30, refs, True), device="cpu", depth=depth)
        peak = self._consume(loader, refs, bound=depth + 2)
        print(f"CudaPrefetcher depth={depth}: peak {peak} live batches (bound {depth + 2})")

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize(("outer", "inner"), [(1, 1), (2, 3), (3, 2)])
    def test_stacked(self, outer: int, inner: int) -> None:
        """CudaPrefetcher(BackgroundLoader(depth=i), depth=o) keeps at most i + o + 2 alive."""
        refs: list[weakref.ref[Any]] = []
        loader = CudaPrefetcher(
            BackgroundLoader(tracked_source(30, refs, False), depth=inner),
            device="cpu",
            depth=outer,
        )
        peak = self._consume(loader, refs, bound=inner + outer + 2)
        print(f"stacked {inner}+{outer}: peak {peak} live batches (bound {inner + outer + 2})")

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("depth", [1, 3])
    def test_after_break_only_the_read_ahead_is_held(self, depth: int) -> None:
        """After `break` a one-shot source's read-ahead (at most depth) is kept, then freed.

        It is the next epoch's start (nothing read is lost); dropping the loader frees it.
        """
        refs: list[weakref.ref[Any]] = []
        loader = BackgroundLoader(tracked_source(1000, refs, False), depth=depth)
        for index, _batch in enumerate(loader):
            if index == 5:
                break
        del _batch
        assert wait_until(lambda: count_live(refs) <= depth and not prefetch_threads(), 3.0)
        del loader
        assert wait_until(lambda: count_live(refs) == 0, 3.0)

    @staticmethod
    def _consume(loader: Any, refs: list[weakref.ref[Any]], bound: int) -> int:
        """Iterate, letting the producer fill up at each batch; return the peak of live batches."""
        peak = 0
        checks = 0
        iterator = iter(loader)
        for batch in iterator:
            assert batch is not None
            wait_read_ahead(iterator)  # the producer ran ahead as far as it may
            live = count_live(refs)
            peak = max(peak, live)
            checks += 1
            assert live <= bound, f"{live} batches alive, bound {bound}"
        assert checks > 0
        del batch, iterator
        assert wait_until(lambda: count_live(refs) == 0, 3.0)
        return peak
