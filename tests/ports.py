"""A TCP port for a server that a test starts in another process."""

from __future__ import annotations

import random
import socket


def free_port() -> int:
    """A port that is free now, drawn at random from 20000-32767. That is below Linux's ephemeral range (32768-60999),
    from which every bind to port 0 draws, and above Ray's worker ports (10002-19999): the port a bind to 0 returns and
    releases may be handed to another process (a test beside this one) in the seconds before the server binds it."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(20_000, 32_768)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free TCP port in 20000-32767")
