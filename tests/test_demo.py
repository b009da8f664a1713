"""``python -m prefetch.demo`` from a plain install, and its private progress bar."""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import sys
from pathlib import Path

import pytest

import prefetch.demo
from prefetch._shared.progress import ProgressBar

PACKAGE = Path(prefetch.__file__).resolve().parent


class TerminalStream(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


class TestProgressBar:
    """The bar redraws in place on a terminal and writes plain lines anywhere else."""

    def test_plain_lines_without_a_terminal(self) -> None:
        """Not a terminal: no carriage return, the final state on one line, written once."""
        out = io.StringIO()
        bar = ProgressBar(50, "epoch", width=10, stream=out)
        for _ in range(50):
            bar.update(note="loss 1.0")
        bar.close()
        bar.close()
        text = out.getvalue()
        assert "\r" not in text
        lines = text.splitlines()
        assert len(lines) == 1, lines  # 50 quick updates: no line before the final one
        assert lines[0].startswith("epoch [##########] 50/50")
        assert lines[0].endswith("loss 1.0")

    def test_redraws_in_place_on_a_terminal(self) -> None:
        """A terminal: each draw starts with a carriage return; closing ends the line."""
        out = TerminalStream()
        with ProgressBar(2, "epoch", width=2, stream=out) as bar:
            bar.update()
            bar.update()
        text = out.getvalue()
        assert text.startswith("\repoch [..] 0/2")
        assert "\repoch [##] 2/2" in text
        assert text.endswith("\n") and text.count("\n") == 1

    def test_notes_and_overshoot(self) -> None:
        """set_note shows without advancing; updates never count past the total."""
        out = TerminalStream()
        with ProgressBar(3, "x", width=3, stream=out) as bar:
            bar.set_note("warm-up")
            assert bar.done == 0
            bar.update(5)
            assert bar.done == 3
        assert "0/3" in out.getvalue() and "warm-up" in out.getvalue()


def run_demo(folder: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m prefetch.demo *options`` in ``folder``, output to pipes; check it passed."""
    done = subprocess.run(
        [sys.executable, "-m", "prefetch.demo", *options],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=80,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


class TestDemo:
    """The demo runs from the package alone and prints its comparison."""

    def test_uses_nothing_outside_the_package(self) -> None:
        """prefetch.demo imports only the standard library, torch and prefetch itself."""
        tree = ast.parse(Path(prefetch.demo.__file__).read_text(encoding="utf-8"))
        roots = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                roots.add(node.module.split(".")[0])
        assert roots - set(sys.stdlib_module_names) == {"torch", "prefetch"}
        assert not (PACKAGE / "bench").exists()

    @pytest.mark.slow
    @pytest.mark.timeout(90)
    def test_prints_the_comparison_table_in_plain_lines(self, tmp_path: Path) -> None:
        """Run in another folder with output to a pipe: the table, and no carriage returns."""
        done = run_demo(tmp_path, "--epochs", "1", "--batches", "4")
        assert "waited for data" in done.stdout
        assert "plain DataLoader" in done.stdout
        assert "BackgroundLoader(DataLoader)" in done.stdout
        assert "identical" in done.stdout
        assert "\r" not in done.stdout + done.stderr
        assert "epoch 1/1 plain" in done.stderr and "4/4" in done.stderr

    @pytest.mark.slow
    @pytest.mark.timeout(90)
    def test_fetch_threads_adds_a_row_and_the_knobs_are_named(self, tmp_path: Path) -> None:
        """--fetch-threads 2 adds its row; the text says what num_threads and fetch_threads are."""
        options = ["--epochs", "1", "--batches", "3", "--fetch-threads", "2", "--latency-ms", "0.5"]
        done = run_demo(tmp_path, *options)
        assert "\nfetch_threads=2 " in done.stdout
        assert "(it is not a count of loading threads)" in done.stdout
        assert "fetch_threads='auto' reads batches in" in done.stdout
        assert "identical" in done.stdout

    def test_fetch_threads_argument_is_checked(self) -> None:
        """--fetch-threads takes 'auto' or an int >= 1, and says so otherwise."""
        assert prefetch.demo.fetch_threads_argument("auto") == "auto"
        assert prefetch.demo.fetch_threads_argument("3") == 3
        for wrong in ("0", "many"):
            with pytest.raises(argparse.ArgumentTypeError, match="'auto' or an int >= 1"):
                prefetch.demo.fetch_threads_argument(wrong)
