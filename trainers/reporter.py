"""The one channel between a trainer and the worker that launched it.

Rank 0 connects to the worker's TCP address (``--report-to HOST:PORT``) and exchanges JSON
lines. Each message the trainer sends gets exactly one reply:

* ``{"type": "start", ...}`` once, after setup; ``{"type": "eval", ...}`` after each
  evaluation. The reply is ``{"action": "continue" | "stop", "reason": str,
  "deadline_s": float | null}``: the worker may stop the trial, and it may move the deadline
  (elapsed seconds after which the trainer stops on its own, without waiting for an evaluation).
* ``{"type": "end", "reason": ...}`` once, last. The reply is ``{"action": "ack"}``.

Without ``--report-to`` the :class:`PrintReporter` writes the same messages to stdout and
always answers "continue", so a trainer runs standalone.
"""

from __future__ import annotations

import json
import socket
from typing import Any

__all__ = ["Reporter", "PrintReporter", "SocketReporter", "connect"]

Message = dict[str, Any]


class Reporter:
    """Sends a message and returns the worker's reply."""

    def send(self, message: Message) -> Message:
        raise NotImplementedError

    def close(self) -> None:
        """Releases the channel."""


class PrintReporter(Reporter):
    """Standalone use: prints each message as a JSON line and always continues."""

    def send(self, message: Message) -> Message:
        print(json.dumps(message), flush=True)
        if message.get("type") == "end":
            return {"action": "ack"}
        return {"action": "continue", "reason": "", "deadline_s": None}


class SocketReporter(Reporter):
    """JSON lines over one TCP connection to the worker."""

    def __init__(self, address: str, timeout_s: float = 60.0) -> None:
        host, _, port = address.rpartition(":")
        self._sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self._file = self._sock.makefile("rwb")

    def send(self, message: Message) -> Message:
        self._file.write(json.dumps(message).encode() + b"\n")
        self._file.flush()
        line = self._file.readline()
        if not line:
            raise ConnectionError("the worker closed the report channel")
        reply: Message = json.loads(line)
        return reply

    def close(self) -> None:
        try:
            self._file.close()
        finally:
            self._sock.close()


def connect(address: str | None) -> Reporter:
    """A reporter for ``address`` (``HOST:PORT``), or a printing one when it is ``None``."""
    return SocketReporter(address) if address else PrintReporter()
