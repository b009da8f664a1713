"""Small sources shared by the tests."""

from __future__ import annotations

from collections.abc import Iterator


class Stateful:
    """A minimal stateful loader: state is the position of the next item."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.position = 0
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        self.position = self.start
        self.start = 0
        while self.position < self.n:
            self.position += 1
            yield self.position - 1

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["position"]
