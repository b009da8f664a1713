"""accelerate in the tests: make ``Accelerator``s, and reset accelerate's process-wide state.

An ``Accelerator`` leaves accelerate's state (``AcceleratorState``,
``GradientState``) initialised for the whole process, so every test that makes
one resets it afterwards, as accelerate's own tests do: later tests wrap plain
DataLoaders and must not see an Accelerator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


def reset_accelerate() -> None:
    """Forget every Accelerator made so far (accelerate's state is process-wide)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture
def make_accelerator() -> Iterator[Callable[..., Any]]:
    """``make(stateful=False, accumulation=1, **config)``: a CPU Accelerator; reset after the test.

    ``stateful`` is ``use_stateful_dataloader``; ``config`` the rest of the
    ``DataLoaderConfiguration`` (``dispatch_batches=True``, ...).
    """
    accelerate = pytest.importorskip("accelerate")
    from accelerate.utils import DataLoaderConfiguration

    made: list[Any] = []

    def make(stateful: bool = False, accumulation: int = 1, **config: Any) -> Any:
        loaders = DataLoaderConfiguration(use_stateful_dataloader=stateful, **config)
        made.append(
            accelerate.Accelerator(
                cpu=True, gradient_accumulation_steps=accumulation, dataloader_config=loaders
            )
        )
        return made[-1]

    yield make
    for accelerator in made:
        accelerator.free_memory()
    reset_accelerate()
