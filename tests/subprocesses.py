"""Child Pythons for the signal and DDP tests: start, read lines, clean up."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from .processes import session_members

ROOT = Path(__file__).resolve().parent.parent
"""The repository root (child processes run there, with it importable)."""


def free_port() -> int:
    """Return a TCP port on the loopback interface that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def subprocess_env(**extra: str) -> dict[str, str]:
    """Return an environment for child Pythons: the repo importable, one intra-op thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def torchrun(world: int, target: list[str], timeout: float) -> None:
    """Run ``target`` (a script and its arguments, or ``-m module ...``) on ``world`` processes.

    ``python -m torch.distributed.run`` on the loopback interface (gloo);
    fail with the children's output if it fails or runs past ``timeout``.
    """
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={world}",
        "--nnodes=1",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        *target,
    ]
    env = subprocess_env(GLOO_SOCKET_IFNAME="lo", TORCH_CPP_LOG_LEVEL="ERROR")
    try:
        result = subprocess.run(
            command,
            env=env,
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as error:
        raise AssertionError(f"torchrun hung: {error.stderr!r:.3000}") from None
    assert result.returncode == 0, result.stderr[-4000:]


def start_script(code: str) -> subprocess.Popen[str]:
    """Start ``code`` in a new Python process in its own session (stdout/stderr piped)."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        cwd=str(ROOT),
        start_new_session=True,
    )


class LineReader:
    """Collect a subprocess's stdout lines in a background thread; wait for one by prefix."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        import queue

        self.proc = proc
        self.other: list[str] = []
        self.lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._read, name="test-line-reader", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, marker: str, timeout: float) -> str | None:
        """Return the next line starting with ``marker``, or ``None`` after ``timeout`` or EOF."""
        import queue

        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                return None
            if line is None:
                return None
            if line.startswith(marker):
                return line
            self.other.append(line)


def kill_session(session_id: int) -> None:
    """SIGKILL every process left in ``session_id`` (cleanup after a failed test)."""
    import signal

    for pid in session_members(session_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
