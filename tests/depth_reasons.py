"""Reason texts the depth tests compare against (shared by the policy and trace tests)."""

from __future__ import annotations

SLOWER = (
    "hold: the producer is slower on average (1.25 s/item vs 1 s/step) and never got ahead; "
    "no buffer makes up a throughput deficit"
)
NEVER_FULL = (
    "hold: the buffer never filled since it last ran low; a deeper one would not have helped"
)
