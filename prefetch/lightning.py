"""Log the loaders' stats from a Lightning ``Trainer``: :class:`LoaderStatsMonitor`.

This module imports ``lightning`` (Lightning 2, ``import lightning``);
``import prefetch`` does not, so only code that wants the callback needs it::

    from prefetch.lightning import LoaderStatsMonitor

    trainer = L.Trainer(callbacks=[LoaderStatsMonitor()], logger=TensorBoardLogger("runs"))
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks.callback import Callback

from prefetch._shared.wrapper import LoaderWrapper

__all__ = ["LoaderStatsMonitor"]


def _loaders(iterables: Any, stage: str) -> Iterator[tuple[str, Any]]:
    """``(name, loader)`` for each loader Lightning holds for ``stage`` (one, a list or a dict)."""
    if isinstance(iterables, dict):
        for key, value in iterables.items():
            yield f"{stage}/{key}", value
    elif isinstance(iterables, list | tuple):
        for index, value in enumerate(iterables):
            yield (f"{stage}/{index}" if len(iterables) > 1 else stage), value
    elif iterables is not None:
        yield stage, iterables


def _layers(loader: Any) -> Iterator[tuple[str, LoaderWrapper]]:
    """``(name, wrapper)`` for each prefetch wrapper of a stack, outermost first."""
    seen: dict[str, int] = {}
    while isinstance(loader, LoaderWrapper):
        name = type(loader).__name__
        seen[name] = seen.get(name, 0) + 1
        yield (name if seen[name] == 1 else f"{name}_{seen[name]}"), loader
        loader = loader.loader


class LoaderStatsMonitor(Callback):
    """Log each prefetch wrapper's stats to the trainer's loggers at the end of every epoch.

    At the end of each training, validation (not the sanity check) and test
    epoch it logs, for every :class:`~prefetch.BackgroundLoader` or
    :class:`~prefetch.CudaPrefetcher` in the stage's loaders, the epoch's
    :meth:`LoaderStats.scalars <prefetch.LoaderStats.scalars>` and the
    wrapper's :attr:`~prefetch.BackgroundLoader.total_stats` scalars, to every
    logger (``logger.log_metrics`` at ``trainer.global_step``; Lightning's
    loggers write on rank 0 only, so these are rank 0's loaders). The names
    are ``{prefix}{stage}/{Wrapper}/{figure}`` for the epoch and
    ``{prefix}{stage}/{Wrapper}/total/{figure}`` for the totals, for example
    ``prefetch/train/BackgroundLoader/wait_fraction``; ``{stage}`` is
    ``train``, ``val`` or ``test``, followed by ``/{index}`` or ``/{key}``
    when the stage has several loaders. In a stack each layer is logged: the
    outermost one's wait is what the loop saw, an inner ``BackgroundLoader``
    adds its depth and threads. Validation's totals include the sanity
    check's epoch, which the loader did run.

    Args:
        prefix: Prepended to every name.
        epoch: Log each epoch's figures.
        total: Log the totals over the epochs so far.

    Raises:
        MisconfigurationException: At ``fit``/``validate``/``test``, if the
            trainer has no logger.

    Example:
        >>> import lightning as L
        >>> from prefetch.lightning import LoaderStatsMonitor
        >>> monitor = LoaderStatsMonitor(prefix="data/", total=False)
        >>> isinstance(monitor, L.Callback)
        True
    """

    def __init__(
        self, prefix: str = "prefetch/", *, epoch: bool = True, total: bool = True
    ) -> None:
        if not isinstance(prefix, str):
            msg = f"LoaderStatsMonitor(prefix=...) expects a str, got {prefix!r}"
            raise TypeError(msg)
        if not (epoch or total):
            msg = "LoaderStatsMonitor(epoch=False, total=False) would log nothing: keep one True"
            raise ValueError(msg)
        self.prefix = prefix
        self.epoch = epoch
        self.total = total
        self._warned: set[str] = set()

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Check that the trainer has a logger to write to."""
        if not trainer.loggers:
            msg = (
                "LoaderStatsMonitor needs a logger to write to, got a Trainer with logger=False; "
                "pass Trainer(logger=...) (TensorBoardLogger, CSVLogger, ...)"
            )
            raise MisconfigurationException(msg)

    def metrics(self, stage: str, iterables: Any) -> dict[str, float]:
        """Return the scalars this callback logs for ``stage``'s loaders ``iterables``.

        Example:
            >>> from prefetch import BackgroundLoader
            >>> from prefetch.lightning import LoaderStatsMonitor
            >>> loader = BackgroundLoader([1, 2])
            >>> for item in loader:
            ...     pass
            >>> metrics = LoaderStatsMonitor(total=False).metrics("train", loader)
            >>> metrics["prefetch/train/BackgroundLoader/items"]
            2.0
        """
        metrics: dict[str, float] = {}
        for name, loader in _loaders(iterables, stage):
            for layer, wrapper in _layers(loader):
                base = f"{self.prefix}{name}/{layer}/"
                if self.epoch:
                    metrics.update(wrapper.stats.scalars(base))
                if self.total:
                    metrics.update(wrapper.total_stats.scalars(f"{base}total/"))
        return metrics

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Log the training loaders' stats."""
        self._log(trainer, "train", trainer.train_dataloader)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Log the validation loaders' stats (not after the sanity check)."""
        if not trainer.sanity_checking:
            self._log(trainer, "val", trainer.val_dataloaders)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Log the test loaders' stats."""
        self._log(trainer, "test", trainer.test_dataloaders)

    def _log(self, trainer: pl.Trainer, stage: str, iterables: Any) -> None:
        metrics = self.metrics(stage, iterables)
        if not metrics:
            if stage not in self._warned:
                self._warned.add(stage)
                warnings.warn(
                    f"LoaderStatsMonitor: the {stage} loaders hold no prefetch wrapper "
                    f"(got {type(iterables).__name__}), so there is nothing to log for {stage}",
                    UserWarning,
                    stacklevel=2,
                )
            return
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
