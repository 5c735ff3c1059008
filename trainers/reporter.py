"""The one channel between a trainer and the worker that launched it (the messages and
replies are :mod:`trainers.protocol`'s).

Rank 0 connects to the worker's TCP address (``--report-to HOST:PORT``) and exchanges JSON
lines. Each message the trainer sends gets exactly one reply:

* ``{"type": "setup", "phase": str, "at_s": float}`` as setup reaches each phase
  (``distributed``, ``data``, ``model``, ``engine``, ``resume``): a note, with no reply, so
  the worker knows the ranks are alive and where a slow setup is.
* ``{"type": "start", ...}`` once, after setup; ``{"type": "eval", ...}`` after each
  evaluation. The reply is ``{"action": "continue" | "stop", "reason": str,
  "deadline_s": float | null}``: the worker may stop the trial, and it may move the deadline
  (elapsed seconds after which the trainer stops on its own, without waiting for an evaluation).
* ``{"type": "end", "reason": ...}`` once, last. The reply is ``{"action": "ack"}``.
* Warm ranks only (the plan's ``serve``): ``{"type": "ready"}`` after the end, when the
  ranks can take another trial. The reply is the next trial's plan, ``{"action": "plan",
  "plan": {...}}``, or ``{"action": "exit"}``; after a plan the messages above begin again.

The worker may also send, at any time, a request ``{"request": "checkpoint"}``: the trainer
saves a checkpoint at its next step and stops (``reason`` "checkpointed").

Without ``--report-to`` the :class:`PrintReporter` writes the same messages to stdout and
always answers "continue", so a trainer runs standalone.
"""

from __future__ import annotations

import json
import select
import socket
from typing import Any

from trainers import protocol

__all__ = ["Reporter", "PrintReporter", "SocketReporter", "connect"]

Message = dict[str, Any]


class Reporter:
    """Sends a message and returns the worker's reply."""

    def send(self, message: Message) -> Message:
        raise NotImplementedError

    def note(self, message: Message) -> None:
        """Sends ``message`` without waiting for a reply (setup phases)."""

    def asked(self, request: str) -> bool:
        """True once the worker has sent ``request`` (checked without blocking)."""
        return False

    def close(self) -> None:
        """Releases the channel."""


class PrintReporter(Reporter):
    """Standalone use: prints each message as a JSON line and always continues."""

    def send(self, message: Message) -> Message:
        print(json.dumps(message), flush=True)
        if message.get("type") == "end":
            return dict(protocol.ACK)
        return protocol.go()

    def note(self, message: Message) -> None:
        print(json.dumps(message), flush=True)


class SocketReporter(Reporter):
    """JSON lines over one TCP connection to the worker."""

    def __init__(self, address: str, timeout_s: float = 60.0) -> None:
        host, _, port = address.rpartition(":")
        self._sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self._sock.settimeout(None)
        self._buffer = b""
        self._requests: set[str] = set()

    def _line(self, block: bool) -> Message | None:
        """The next message from the worker; None when ``block`` is off and none is there."""
        while b"\n" not in self._buffer:
            if not block and not select.select([self._sock], [], [], 0)[0]:
                return None
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("the worker closed the report channel")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: Message = json.loads(line)
        return message

    def send(self, message: Message) -> Message:
        self._sock.sendall(json.dumps(message).encode() + b"\n")
        while True:
            reply = self._line(block=True)
            if reply is None:  # unreachable: a blocking read returns a message or raises
                continue
            if "request" not in reply:
                return reply
            self._requests.add(str(reply["request"]))  # unsolicited: kept for asked()

    def note(self, message: Message) -> None:
        self._sock.sendall(json.dumps(message).encode() + b"\n")

    def asked(self, request: str) -> bool:
        while (message := self._line(block=False)) is not None:
            self._requests.add(str(message.get("request")))
        return request in self._requests

    def close(self) -> None:
        self._sock.close()


def connect(address: str | None) -> Reporter:
    """A reporter for ``address`` (``HOST:PORT``), or a printing one when it is ``None``."""
    return SocketReporter(address) if address else PrintReporter()
