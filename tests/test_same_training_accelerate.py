"""accelerate sees, step for step, what it sees with the plain prepared loader (issue 33).

accelerate's prepared loaders (``DataLoaderShard``, ``DataLoaderDispatcher``)
set ``end_of_dataloader`` and enter and leave ``GradientState`` inside their
own iteration. ``Accelerator.accumulate()`` syncs gradients on
``end_of_dataloader``, and ``gather_for_metrics`` drops a padded last batch's
duplicates on ``end_of_dataloader`` and ``remainder``. A wrapper that runs
that iteration ahead of the loop moves the flags to the wrong step. Here the
loop records, at every step of two epochs, the batch, ``sync_gradients``,
``end_of_dataloader``, ``remainder`` and what ``gather_for_metrics`` returns,
with the plain prepared loader and through each wrapper stack; two processes
(torchrun, gloo) check ``gather_for_metrics`` on a padded last batch.

``skip_first_batches`` (what transformers' Trainer calls to resume mid-epoch)
rebuilds a ``DataLoader`` from the loader's attributes: a wrapper's own
options must never stand in for the DataLoader's attributes of the same name.
"""

from __future__ import annotations

import inspect
import json
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from prefetch import BackgroundLoader, CudaPrefetcher

from .accelerators import reset_accelerate
from .liveness import wait_read_ahead
from .same_training import STACKS, THREAD_STACKS, assert_same_steps
from .subprocesses import torchrun

accelerate = pytest.importorskip("accelerate")
from accelerate.data_loader import _PYTORCH_DATALOADER_KWARGS  # noqa: E402

SAMPLES = 19  # 10 batches of 2, the last one short: remainder 1
BATCH = 2
ACCUMULATION = 4
EPOCHS = 2

PREPARED: dict[str, dict[str, bool]] = {
    "shard": {},
    "shard_stateful": {"stateful": True},
    "dispatcher": {"dispatch_batches": True},
}
"""accelerate's prepared loaders: DataLoaderShard (stateful or not), DataLoaderDispatcher."""

DEEP_STACKS: dict[str, Callable[[Any], Any]] = {
    "background_depth8": lambda loader: BackgroundLoader(loader, depth=8),
    "cuda_over_background_depth8": lambda loader: CudaPrefetcher(BackgroundLoader(loader, depth=8)),
}
"""Stacks whose thread reads far ahead at once (past the break, to the short last batch)."""


def samples() -> torch.Tensor:
    """Sample ``i`` is the number ``i`` (the batches show which samples they hold)."""
    return torch.arange(SAMPLES)


def accumulate_steps(accelerator: Any, wrap: Callable[[Any], Any]) -> list[dict[str, Any]]:
    """Train EPOCHS epochs with accumulation; what accelerate shows the loop at every step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = wrap(accelerator.prepare(DataLoader(samples(), batch_size=BATCH)))
    state = accelerator.gradient_state
    steps: list[dict[str, Any]] = []
    for epoch in range(EPOCHS):
        for step, batch in enumerate(loader):
            with accelerator.accumulate(model):
                loss = model(batch.float().unsqueeze(1)).pow(2).mean()
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                steps.append(
                    {
                        "epoch": epoch,
                        "step": step,
                        "batch": batch.tolist(),
                        "sync_gradients": accelerator.sync_gradients,
                        "end_of_dataloader": state.end_of_dataloader,
                        "remainder": state.remainder,
                        "gathered": accelerator.gather_for_metrics(batch).tolist(),
                    }
                )
        steps.append({"epoch": epoch, "after_loop_in_dataloader": state.in_dataloader})
    steps.append({"weight": model.weight.item(), "bias": model.bias.item()})
    return steps


class TestGradientAccumulation:
    """accumulation 4 over 10 batches, two epochs: the flags at every step, plain vs wrapped."""

    @pytest.mark.parametrize("prepared", sorted(PREPARED))
    def test_plain_run_is_what_accelerate_documents(
        self, prepared: str, make_accelerator: Callable[..., Any]
    ) -> None:
        """The reference: syncs at steps 3, 7 and 9; the end (remainder 1) reported at 9 only."""
        accelerator = make_accelerator(accumulation=ACCUMULATION, **PREPARED[prepared])
        steps = [s for s in accumulate_steps(accelerator, lambda x: x) if "step" in s]
        for epoch in range(EPOCHS):
            epoch_steps = [s for s in steps if s["epoch"] == epoch]
            assert [s["step"] for s in epoch_steps if s["sync_gradients"]] == [3, 7, 9]
            assert [s["step"] for s in epoch_steps if s["end_of_dataloader"]] == [9]
            assert epoch_steps[-1]["remainder"] == SAMPLES % BATCH
            assert [s["gathered"] for s in epoch_steps] == [s["batch"] for s in epoch_steps]

    @pytest.mark.parametrize("stack", sorted(STACKS))
    @pytest.mark.parametrize("prepared", sorted(PREPARED))
    def test_every_step_as_plain(
        self, prepared: str, stack: str, make_accelerator: Callable[..., Any]
    ) -> None:
        """sync_gradients, end_of_dataloader, remainder and gather_for_metrics at each step."""
        config: dict[str, Any] = {"accumulation": ACCUMULATION, **PREPARED[prepared]}
        plain = accumulate_steps(make_accelerator(**config), lambda x: x)
        reset_accelerate()
        wrapped = accumulate_steps(make_accelerator(**config), STACKS[stack])
        assert_same_steps(plain, wrapped, f"{stack} over {prepared}")

    @pytest.mark.parametrize("stack", sorted(STACKS))
    def test_a_break_leaves_the_gradient_state_as_plain(
        self, stack: str, make_accelerator: Callable[..., Any]
    ) -> None:
        """After a break at step 5 and the next full epoch, accelerate's flags are plain's."""

        def run(wrap: Callable[[Any], Any]) -> list[Any]:
            accelerator = make_accelerator(accumulation=ACCUMULATION)
            loader = wrap(accelerator.prepare(DataLoader(samples(), batch_size=BATCH)))
            state = accelerator.gradient_state
            seen: list[Any] = []
            for step, batch in enumerate(loader):
                seen.append((batch.tolist(), state.end_of_dataloader, state.remainder))
                if step == 5:
                    break
            seen.append(("after break", state.end_of_dataloader))
            seen += [(b.tolist(), state.end_of_dataloader, state.remainder) for b in loader]
            seen.append(("after epoch", state.in_dataloader))
            reset_accelerate()
            return seen

        assert_same_steps(run(lambda x: x), run(STACKS[stack]), stack)

    @pytest.mark.parametrize("stack", sorted(DEEP_STACKS))
    def test_a_break_leaves_a_seeded_shuffle_as_plain(
        self, stack: str, make_accelerator: Callable[..., Any]
    ) -> None:
        """Shuffled with a generator, cut at step 6 of 10: the next two epochs' batches are plain's.

        The read-ahead (8 deep) draws the short last batch, and with it the
        next permutation, before the break; the wrapper sets the generator back.
        """

        def run(wrap: Callable[[Any], Any]) -> list[Any]:
            accelerator = make_accelerator(accumulation=ACCUMULATION)
            generator = torch.Generator().manual_seed(0)
            shuffled = DataLoader(samples(), batch_size=BATCH, shuffle=True, generator=generator)
            loader = wrap(accelerator.prepare(shuffled))
            seen: list[Any] = []
            for step, batch in enumerate(loader):
                seen.append(batch.tolist())
                if step == 6:
                    ours = getattr(loader.base_dataloader, "_newest", None)  # inside accelerate's
                    if ours is not None:  # let its thread read as far ahead as it may
                        wait_read_ahead(ours())
                    break
            for _ in range(2):
                seen.append([batch.tolist() for batch in loader])
            reset_accelerate()
            return seen

        plain = run(lambda x: x)
        assert plain[-1] != plain[-2]  # each epoch its own order: the check can fail
        assert_same_steps(plain, run(DEEP_STACKS[stack]), stack)


# --- two processes: gather_for_metrics over a padded last batch -------------------------

WORLD = 2
GATHER_SIZE = 13  # batch 2 on 2 ranks: 4, 4, 4 and a last batch padded from 1 to 4
LAUNCH_TIMEOUT = 150


@pytest.fixture(scope="module")
def gathered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Run tests/accelerate_gather_run.py on 2 processes; each rank's record per stack."""
    out = tmp_path_factory.mktemp("gather")
    torchrun(
        WORLD, ["-m", "tests.accelerate_gather_run", str(out), str(GATHER_SIZE)], LAUNCH_TIMEOUT
    )
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


def steps(epochs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One record per step, each with its epoch and step numbers."""
    return [
        {"epoch": epoch, "step": step, **record}
        for epoch, records in enumerate(epochs)
        for step, record in enumerate(records)
    ]


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
class TestGatherForMetricsTwoProcesses:
    """What gather_for_metrics returns at each step of a 2-process evaluation, by sample id."""

    def test_plain_gathers_every_sample_once(self, gathered: list[dict[str, Any]]) -> None:
        """The reference: 4, 4, 4 and 1 samples, every sample once, the padding dropped."""
        for record in gathered:
            for epoch in record["plain"]:
                steps = [step["gathered"] for step in epoch]
                assert [len(ids) for ids in steps] == [4, 4, 4, 1]
                assert sorted(i for ids in steps for i in ids) == list(range(GATHER_SIZE))

    @pytest.mark.parametrize("stack", sorted(STACKS))
    def test_every_step_as_plain(self, stack: str, gathered: list[dict[str, Any]]) -> None:
        """Each rank gathers the same samples at each step as with the plain prepared loader."""
        for rank, record in enumerate(gathered):
            assert_same_steps(steps(record["plain"]), steps(record[stack]), f"rank {rank}: {stack}")

    @pytest.mark.parametrize("stack", sorted(THREAD_STACKS))
    def test_fetch_threads_over_a_sampler_of_your_own(
        self, stack: str, gathered: list[dict[str, Any]]
    ) -> None:
        """fetch_threads reads an unprepared DataLoader: the same steps as that DataLoader."""
        for rank, record in enumerate(gathered):
            plain, wrapped = steps(record["own_sampler"]), steps(record[stack])
            assert_same_steps(plain, wrapped, f"rank {rank}: {stack}")


# --- skip_first_batches: a DataLoader rebuilt from a wrapper's attributes ------------------

MISSING = object()
DATALOADER_PARAMETERS = sorted(
    set(inspect.signature(DataLoader.__init__).parameters) - {"self"}
    | set(_PYTORCH_DATALOADER_KWARGS)
)
"""Every DataLoader keyword and every attribute ``skip_first_batches`` reads as one."""

SHARD_ATTRIBUTES = ["device", "rng_types", "synchronized_generator", "torch_device_mesh"]
"""What skip_first_batches reads from a DataLoaderShard to rebuild one (and iteration)."""


def worker_init(worker: int) -> None:
    """A worker_init_fn the rebuilt DataLoader must keep."""


def unusual_dataloader() -> DataLoader[Any]:
    """A DataLoader whose every keyword differs from its default (never iterated)."""
    return DataLoader(
        list(range(20)),
        batch_size=3,
        num_workers=1,
        collate_fn=lambda batch: batch,
        pin_memory=True,
        drop_last=True,
        timeout=7,
        worker_init_fn=worker_init,
        multiprocessing_context="spawn",
        generator=torch.Generator(),
        prefetch_factor=5,
        persistent_workers=True,
        pin_memory_device="cpu",
        in_order=False,
    )


OPTION_STACKS: dict[str, Callable[[Any], Any]] = {
    **STACKS,
    "own_options": lambda loader: BackgroundLoader(loader, depth=3, timeout=30.0),
    "pinning": lambda loader: BackgroundLoader(loader, pin_memory=True),
    "cuda": CudaPrefetcher,
}
"""Stacks for the attribute checks, some with the wrapper's own same-named options set."""

UNORDERED_THREADS: Callable[[Any], Any] = lambda loader: BackgroundLoader(  # noqa: E731
    loader, fetch_threads=2, in_order=False, timeout=30.0
)


def quietly(make: Callable[[], Any]) -> Any:
    """``make()`` with the CPU build's pinning warnings silenced (pin_memory=True above)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin.*memory.*")
        warnings.filterwarnings("ignore", message=".*accelerator.*")
        return make()


class TestNoShadowing:
    """A wrapper answers every DataLoader attribute with the wrapped DataLoader's value."""

    @pytest.mark.parametrize("stack", sorted(OPTION_STACKS))
    def test_every_dataloader_keyword_reads_through(self, stack: str) -> None:
        """timeout, in_order, pin_memory, ...: the DataLoader's, not the wrapper's options."""
        inner = unusual_dataloader()
        wrapped = quietly(lambda: OPTION_STACKS[stack](inner))
        differ = {
            name: (getattr(inner, name, MISSING), getattr(wrapped, name, MISSING))
            for name in DATALOADER_PARAMETERS
            if getattr(inner, name, MISSING) != getattr(wrapped, name, MISSING)
        }
        assert differ == {}, f"(DataLoader's, wrapper's) values: {differ}"

    def test_fetch_threads_options_do_not_shadow(self) -> None:
        """in_order=False and a timeout on a fetch_threads loader leave the DataLoader's visible."""
        inner = DataLoader(list(range(20)), batch_size=3, pin_memory=False)
        wrapped = UNORDERED_THREADS(inner)
        assert (wrapped.in_order, wrapped.timeout, wrapped.pin_memory) == (True, 0, False)

    @pytest.mark.parametrize("stack", sorted(OPTION_STACKS))
    def test_a_prepared_loaders_attributes_read_through(
        self, stack: str, make_accelerator: Callable[..., Any]
    ) -> None:
        """Over a DataLoaderShard: its keywords and what skip_first_batches rebuilds it from."""
        prepared = make_accelerator().prepare(DataLoader(list(range(20)), batch_size=3))
        wrapped = quietly(lambda: OPTION_STACKS[stack](prepared))
        names = [*DATALOADER_PARAMETERS, *SHARD_ATTRIBUTES, "iteration"]
        differ = {
            name: (getattr(prepared, name, MISSING), getattr(wrapped, name, MISSING))
            for name in names
            if getattr(prepared, name, MISSING) != getattr(wrapped, name, MISSING)
        }
        assert differ == {}, f"(prepared loader's, wrapper's) values: {differ}"


MADE_ANEW = {"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"}
REBUILT_FROM_ATTRIBUTES = sorted(set(_PYTORCH_DATALOADER_KWARGS) - MADE_ANEW)
"""The keywords skip_first_batches copies from the loader's attributes (the rest it makes anew)."""


def rebuilt_keywords(loader: Any) -> dict[str, Any]:
    """The keywords skip_first_batches gave the DataLoader it built, as that DataLoader has them."""
    return {name: getattr(loader, name, MISSING) for name in REBUILT_FROM_ATTRIBUTES}


class TestSkipFirstBatches:
    """accelerate.skip_first_batches over a wrapper rebuilds what it rebuilds over the loader."""

    @pytest.mark.parametrize("stack", sorted(OPTION_STACKS))
    def test_rebuilt_dataloader_gets_the_dataloaders_keywords(self, stack: str) -> None:
        """Every keyword of the rebuilt DataLoader is the one it gets from the bare DataLoader."""
        inner = unusual_dataloader()
        wrapped = quietly(lambda: OPTION_STACKS[stack](inner))
        expected = quietly(lambda: accelerate.skip_first_batches(inner, 2))
        got = quietly(lambda: accelerate.skip_first_batches(wrapped, 2))
        assert rebuilt_keywords(got) == rebuilt_keywords(expected)
        assert list(got.batch_sampler) == list(expected.batch_sampler)

    @pytest.mark.parametrize("stack", sorted(STACKS) + sorted(THREAD_STACKS))
    def test_rebuilt_loader_gives_the_same_batches(self, stack: str) -> None:
        """Over a plain DataLoader: the rebuilt loader works and skips the same batches."""
        inner = DataLoader(list(range(20)), batch_size=3)
        expected = [b.tolist() for b in accelerate.skip_first_batches(inner, 2)]
        assert expected[0] == [6, 7, 8]
        got = accelerate.skip_first_batches(THREAD_STACKS.get(stack, STACKS.get(stack))(inner), 2)
        assert [b.tolist() for b in got] == expected

    @pytest.mark.parametrize("stack", sorted(STACKS))
    @pytest.mark.parametrize("prepared", sorted(PREPARED))
    def test_over_a_prepared_loader_accelerate_sees_what_it_sees_plain(
        self, prepared: str, stack: str, make_accelerator: Callable[..., Any]
    ) -> None:
        """The resumed epoch's batches and accelerate's flags at each step are plain's.

        Plain, skip_first_batches rebuilds a DataLoaderShard (or Dispatcher): it
        enters GradientState and reports its end. Over a wrapper it sees no
        prepared loader (isinstance fails) and builds a bare DataLoader, which
        never does, unless the wrapper arranges otherwise.
        """
        accelerator = make_accelerator(accumulation=ACCUMULATION, **PREPARED[prepared])
        state = accelerator.gradient_state

        def resumed_steps(loader: Any) -> list[Any]:
            rebuilt = accelerate.skip_first_batches(loader, 6)
            return [(b.tolist(), state.end_of_dataloader, state.remainder) for b in rebuilt]

        prepared_loader = accelerator.prepare(DataLoader(samples(), batch_size=BATCH))
        plain = resumed_steps(prepared_loader)
        assert [(batch, end) for batch, end, _ in plain] == [
            ([12, 13], False), ([14, 15], False), ([16, 17], False), ([18], True)
        ]  # fmt: skip
        assert plain[-1][2] == SAMPLES % BATCH
        wrapped = resumed_steps(STACKS[stack](prepared_loader))
        assert_same_steps(plain, wrapped, f"skip_first_batches({stack} over {prepared})")
