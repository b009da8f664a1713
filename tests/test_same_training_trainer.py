"""transformers.Trainer logs, through each wrapper, what it logs with its plain loaders (issue 33).

A tiny BERT built from a config (nothing downloaded) trains two epochs on
in-memory data with gradient accumulation 2, saves a checkpoint in the middle
of epoch 1, evaluates each epoch, and is resumed from that checkpoint. The
train and eval loaders are wrapped the natural way, by overriding
``get_train_dataloader`` and ``get_eval_dataloader``; the logged losses, the
eval metrics and the resumed run's logs must be plain's.

Two families: Trainer's own prepared loaders (``accelerator.prepare``: a
wrapper goes inside them, around their base DataLoader, and the prepared
loader comes back), and a ``DataLoader`` of the user's own returned from
``get_train_dataloader``; ``fetch_threads`` applies to both.

On resume Trainer calls ``get_resumed_dataloader`` -> accelerate's
``skip_first_batches``, which builds a new loader: over a prepared loader a
new prepared one (the same training, not prefetching), over a wrapper of the
user's DataLoader a bare one. The Integrations page's one-line override of
``get_resumed_dataloader`` keeps the resumed epoch prefetching; tested here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from prefetch import BackgroundLoader

from .same_training import STACKS, THREAD_STACKS, assert_same_steps, untimed

transformers = pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
]

TRAIN, EVAL = 24, 10  # batch 4: 6 train batches (3 optimizer steps), eval 4, 4 and 2
BATCH = 4
ACCUMULATION = 2
CHECKPOINT = 4  # global step 4: epoch 1 after 2 of its 6 batches
LEFT = TRAIN // BATCH - 2  # batches the resumed epoch reads
PLAIN: Callable[[Any], Any] = lambda loader: loader  # noqa: E731


class Sentences(Dataset[dict[str, torch.Tensor]]):
    """``size`` random token sequences of length 8 with binary labels, fixed by ``seed``."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(1, 100, (size, 8), generator=generator)
        self.labels = torch.randint(0, 2, (size,), generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.tokens[index],
            "attention_mask": torch.ones(8, dtype=torch.long),
            "labels": self.labels[index],
        }


collate = transformers.default_data_collator


def tiny_bert() -> Any:
    """Two layers, hidden size 32, vocabulary 100: built from a config, with its dropout."""
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=16,
        num_labels=2,
    )
    return transformers.BertForSequenceClassification(config)


def trainer_class(
    wrap: Callable[[Any], Any], *, own: bool = False, keep_prefetching: bool = False
) -> type[Any]:
    """A Trainer whose train and eval loaders go through ``wrap``.

    ``own``: ``get_train_dataloader`` and ``get_eval_dataloader`` return DataLoaders
    of the user's own (the train one shuffled from torch's global generator)
    instead of Trainer's prepared ones.
    ``keep_prefetching``: the Integrations page's ``get_resumed_dataloader`` override.
    """

    class Wrapped(transformers.Trainer):  # type: ignore[misc,name-defined]
        resumed: Any = None
        unprepared = own

        def get_train_dataloader(self) -> Any:
            if own:
                return wrap(DataLoader(self.train_dataset, BATCH, shuffle=True, collate_fn=collate))
            return wrap(super().get_train_dataloader())

        def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
            if own:
                return wrap(DataLoader(self.eval_dataset, BATCH, collate_fn=collate))
            return wrap(super().get_eval_dataloader(eval_dataset))

        def get_resumed_dataloader(self, dataloader: Any, num_batches: int) -> Any:
            if keep_prefetching:  # the docs' override, with the wrapper's own options
                self.resumed = rewrap(dataloader, super().get_resumed_dataloader)(num_batches)
            else:
                self.resumed = super().get_resumed_dataloader(dataloader, num_batches)
            return self.resumed

    return Wrapped


def prefetcher(loader: Any) -> Any:
    """The BackgroundLoader of ``loader``: itself, or the one inside a prepared loader."""
    inside = getattr(loader, "base_dataloader", None)
    return inside if isinstance(inside, BackgroundLoader) else loader


def rewrap(wrapped: Any, resume: Callable[[Any, int], Any]) -> Callable[[int], Any]:
    """The docs' override: resume what Trainer gave (the prepared loader) and wrap it again.

    A wrapper of the user's own DataLoader is resumed below it instead.
    """
    wrapper = prefetcher(wrapped)
    if not isinstance(wrapper, BackgroundLoader):
        return lambda n: resume(wrapped, n)
    options = {"fetch_threads": wrapper.fetch_threads} if wrapper.fetch_threads else {}
    if wrapper is not wrapped:  # inside a prepared loader
        return lambda n: BackgroundLoader(resume(wrapped, n), **options)
    return lambda n: BackgroundLoader(resume(wrapped.loader, n), **options)


def train(
    cls: type[Any], out: Path, resume_from: Path | None = None
) -> tuple[Any, list[dict[str, Any]], dict[str, float]]:
    """Train (or resume) and evaluate once more; the trainer, its logs and the last metrics."""
    arguments = transformers.TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATION,
        num_train_epochs=2,
        learning_rate=1e-2,
        logging_steps=1,
        eval_strategy="epoch",
        save_strategy="steps",
        save_steps=CHECKPOINT,
        seed=0,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )
    torch.manual_seed(0)
    trainer = cls(
        model=tiny_bert(),
        args=arguments,
        train_dataset=Sentences(TRAIN, seed=1),
        eval_dataset=Sentences(EVAL, seed=2),
    )
    trainer.remove_callback(transformers.PrinterCallback)  # the logs stay in log_history
    with warnings.catch_warnings():
        if cls.unprepared:  # unprepared on purpose: the documented silencing
            warnings.filterwarnings("ignore", message="BackgroundLoader wraps a")
        trainer.train(resume_from_checkpoint=None if resume_from is None else str(resume_from))
        metrics = trainer.evaluate()
    metrics = {key: value for key, value in metrics.items() if "runtime" not in key}
    return trainer, untimed(trainer.state.log_history), untimed([metrics])[0]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The plain runs of both families, full and resumed from their mid-epoch checkpoint."""
    base = tmp_path_factory.mktemp("trainer")
    runs: dict[str, Any] = {}
    for family, own in (("prepared", False), ("own", True)):
        cls = trainer_class(PLAIN, own=own)
        runs[family] = train(cls, base / family)
        checkpoint = base / family / f"checkpoint-{CHECKPOINT}"
        runs[f"{family}_checkpoint"] = checkpoint
        runs[f"{family}_resumed"] = train(cls, base / f"{family}_resumed", checkpoint)
    return runs


ALL_STACKS = {
    f"{family}-{name}": wrap
    for family in ("prepared", "own")
    for name, wrap in {**STACKS, **THREAD_STACKS}.items()
}


def family(stack: str) -> str:
    return stack.split("-")[0]


class TestPlainReference:
    """The plain runs do what the comparisons rely on."""

    @pytest.mark.parametrize("family", ["prepared", "own"])
    def test_logs_every_step_and_evaluates_each_epoch(
        self, family: str, plain: dict[str, Any]
    ) -> None:
        _, logs, metrics = plain[family]
        assert [entry["step"] for entry in logs if "loss" in entry] == [1, 2, 3, 4, 5, 6]
        assert [entry["epoch"] for entry in logs if "eval_loss" in entry] == [1.0, 2.0, 2.0]
        assert set(metrics) == {"eval_loss", "epoch"}

    def test_prepared_resume_is_exact(self, plain: dict[str, Any]) -> None:
        """Resumed mid-epoch, Trainer's own loader logs what the full run logged.

        Only the run's mean training loss differs: it averages the resumed steps.
        """
        _, full, _ = plain["prepared"]
        resumed, logs, _ = plain["prepared_resumed"]
        assert resumed.state.global_step == 6
        drop = "train_loss"
        assert [{k: v for k, v in e.items() if k != drop} for e in logs] == [
            {k: v for k, v in e.items() if k != drop} for e in full
        ]


class TestTrainAndEvaluate:
    """Train, evaluate each epoch, evaluate at the end: plain's logs, step for step."""

    @pytest.mark.parametrize("stack", sorted(ALL_STACKS))
    def test_logs_and_metrics_as_plain(
        self, stack: str, plain: dict[str, Any], tmp_path: Path
    ) -> None:
        own = family(stack) == "own"
        _, logs, metrics = train(trainer_class(ALL_STACKS[stack], own=own), tmp_path)
        _, plain_logs, plain_metrics = plain[family(stack)]
        assert_same_steps(plain_logs, logs, f"{stack}: log_history")
        assert metrics == plain_metrics


class TestResume:
    """Resumed from a mid-epoch checkpoint through the wrappers: plain's resumed logs."""

    @staticmethod
    def resume_as_plain(stack: str, plain: dict[str, Any], path: Path, keep: bool) -> Any:
        """Resume through ``stack`` (``keep``: the docs' override); assert plain's logs."""
        own = family(stack) == "own"
        cls = trainer_class(ALL_STACKS[stack], own=own, keep_prefetching=keep)
        trainer, logs, metrics = train(cls, path, plain[f"{family(stack)}_checkpoint"])
        _, plain_logs, plain_metrics = plain[f"{family(stack)}_resumed"]
        assert_same_steps(plain_logs, logs, f"{stack}: resumed log_history")
        assert metrics == plain_metrics
        return trainer

    @pytest.mark.parametrize("stack", sorted(ALL_STACKS))
    def test_natural_override_resumes_as_plain(
        self, stack: str, plain: dict[str, Any], tmp_path: Path
    ) -> None:
        """Only get_train/get_eval_dataloader overridden: no crash, plain's logs."""
        self.resume_as_plain(stack, plain, tmp_path, keep=False)

    @pytest.mark.parametrize(
        "stack", [s for s in sorted(ALL_STACKS) if "cuda" not in s and "depth4" not in s]
    )
    def test_documented_override_keeps_prefetching(
        self, stack: str, plain: dict[str, Any], tmp_path: Path
    ) -> None:
        """With the docs' get_resumed_dataloader, the resumed epoch reads a BackgroundLoader."""
        trainer = self.resume_as_plain(stack, plain, tmp_path, keep=True)
        assert isinstance(prefetcher(trainer.resumed), BackgroundLoader)
        assert prefetcher(trainer.resumed).stats.items == LEFT
