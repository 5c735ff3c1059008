"""A running trainer as the worker sees it: the launcher and its ranks (one process group),
and the report channel rank 0 talks to (``trainers.reporter`` is the other end)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from .errors import LaunchError

__all__ = ["ReportChannel", "TrainerProcess", "first_error", "remove_shm_buffers",
           "sweep_orphaned_shm_buffers"]

# The last line of a Python traceback: ``ValueError: ...``, ``torch.OutOfMemoryError: ...``,
# a rank's log prefix (``[rank1]: ``) allowed before it.
_ERROR_LINE = re.compile(r"^(\[rank\d+\]:)?\s*((?:[A-Za-z_]\w*\.)*[A-Z]\w*"
                         r"(?:Error|Exception|Exit|Interrupt)(?::\s.*)?)$")
_TRACEBACK = re.compile(r"^(\[rank\d+\]:)?\s*Traceback \(most recent call last\):")
# Messages that say another process or thread failed, not why: a peer rank's socket closing,
# a DataLoader process's error re-raised (its own line follows), the launcher's exit status.
_ECHO = re.compile(r"Caught \w+ in DataLoader|Connection (closed|reset) by peer|Broken pipe|"
                   r"ChildFailedError|returned non-zero exit status|DataLoader worker \(pid")


def first_error(lines: list[str]) -> str | None:
    """The error that ended a trainer, from its log: the first exception message ending a
    traceback that is not an echo of another process's failure (with many ranks, the peers
    of the rank that failed report only that it went away). A line that merely reads like
    one (a script's own log) does not count before a traceback of its process began. None
    if the log holds no exception."""
    in_traceback: set[str] = set()       # the rank prefixes ("" for none) that printed one
    for line in lines:
        line = line.strip()
        header = _TRACEBACK.match(line)
        if header:
            in_traceback.add(header.group(1) or "")
            continue
        found = _ERROR_LINE.match(line)
        if (found and (found.group(1) or "") in in_traceback
                and not _ECHO.search(found.group(2))):
            return found.group(2)[:600]
    return None


def remove_shm_buffers(master_port: int) -> None:
    """Deletes the shared-memory all-reduce buffers DeepSpeed's CPU ranks leave in /dev/shm
    (about 64 MB each, never removed by DeepSpeed): without this, every trial leaks memory."""
    for path in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{master_port}_*"):
        path.unlink(missing_ok=True)


def sweep_orphaned_shm_buffers(folder: Path = Path("/dev/shm")) -> list[Path]:
    """Deletes DeepSpeed's shared-memory buffers that no live process maps: those of trials
    whose worker was killed (SIGKILL) before it could remove them. Returns what it deleted."""
    found = list(folder.glob("deepspeed_allreduce_buffer_*"))
    if not found:
        return []
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue                       # gone, or not ours to read
        if "deepspeed_allreduce_buffer_" in text:
            mapped.update(line.rsplit(None, 1)[-1] for line in text.splitlines()
                          if "deepspeed_allreduce_buffer_" in line)
    gone = [p for p in found if str(p) not in mapped]
    for path in gone:
        path.unlink(missing_ok=True)
    return gone

def _master_port(command: list[str]) -> int | None:
    """The rendezvous port a launcher command names (``--master_port P`` or ``=P``)."""
    for i, arg in enumerate(command):
        if arg.startswith("--master_port="):
            port = arg.partition("=")[2]
        elif arg == "--master_port" and i + 1 < len(command):
            port = command[i + 1]
        else:
            continue
        return int(port) if port.isdigit() else None
    return None


class TrainerProcess:
    """The launcher and its ranks, in their own process group so they stop together."""

    def __init__(self, command: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self.master_port = _master_port(command)
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in wait()
        self._code: int | None = None
        try:
            self.proc = subprocess.Popen(command, env=env, stdout=self._log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        except OSError as e:
            self._log.close()
            raise LaunchError(f"cannot start {command[0]}: {e}") from e

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the whole group, then SIGKILL after ``grace_s``."""
        if not self.running():
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    @property
    def returncode(self) -> int | None:
        """The exit code :meth:`wait` returned; None before."""
        return self._code

    def wait(self, timeout_s: float = 60.0, *, ended: bool = False) -> int:
        """The launcher's exit code, once it has exited (killed after ``timeout_s``).

        With ``ended`` (rank 0 reported the trial's end), 0 as soon as every rank has exited:
        the launcher then only sleeps out its one-second poll and tears itself down, which is
        left to a background thread, and the next trial can start."""
        if ended and self._ranks_exit(timeout_s):
            self._code = 0
            if self.master_port is not None:   # the ranks that mapped them are gone
                remove_shm_buffers(self.master_port)
            threading.Thread(target=self._reap, name="reap-launcher", daemon=True).start()
            return 0
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.wait()
        self._reap()
        self._code = code
        return code

    def unheard_exit(self, grace_s: float = 3.0) -> int:
        """The exit code of a trainer that ended without its end report: its ranks get
        ``grace_s`` to exit on their own (a script that left early), and the launcher then
        exits with their code; ranks still running after that are killed."""
        if self.running() and not self._ranks_exit(grace_s):
            self.kill()
        return self.wait(30.0)

    def _ranks_exit(self, timeout_s: float) -> bool:
        """Waits until the launcher has no live child; False if it is gone or time is up."""
        deadline = time.monotonic() + timeout_s
        try:
            launcher = psutil.Process(self.proc.pid)
        except psutil.Error:
            return False
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                alive = [c for c in launcher.children(recursive=True)
                         if c.status() != psutil.STATUS_ZOMBIE]
            except psutil.Error:
                return False
            if not alive:
                return True
            time.sleep(0.05)
        return False

    def _reap(self) -> None:
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.kill()
        self._log.close()
        if self.master_port is not None:
            remove_shm_buffers(self.master_port)

    def tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        useful = [line for line in text if line.strip()]
        return " | ".join(useful[-lines:])

    def cause(self) -> str:
        """Why the trainer failed: the first error in its log (:func:`first_error`), else the
        log's last lines; with the log's path, where the rest is."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        found = first_error(text)
        return f"{found} (log: {self.log_path})" if found else self.tail()


class ReportChannel:
    """The worker's end of the trainer's report channel (see ``trainers.reporter``)."""

    def __init__(self, host: str = "127.0.0.1", advertise: str | None = None) -> None:
        """Listens on ``host``; the trainer connects to ``advertise`` (default ``host``): a
        name other nodes reach this machine by, when rank 0 runs elsewhere."""
        self._server = socket.create_server((host, 0))
        self._server.settimeout(0.5)
        self.address = f"{advertise or host}:{self._server.getsockname()[1]}"
        self._conn: socket.socket | None = None
        self._buffer = b""   # what came after the last whole message, kept between trials
        # The trainer's last setup note ({"type": "setup", "phase", "at_s"}) and when it
        # came; notes get no reply and are not yielded by ``messages``.
        self.setup_note: dict[str, Any] | None = None
        self.setup_note_at: float | None = None

    def messages(self, process: TrainerProcess, deadline: float | Callable[[], float],
                 idle: Callable[[], None] | None = None) -> Iterator[dict[str, Any]]:
        """Yields each message until the trainer closes the channel, exits, or ``deadline``
        (a ``time.monotonic()`` value, or a function giving the one in force: it may move, as
        a trial's setup limit gives way to its training limit) passes. Reply to each with
        :meth:`reply`. ``idle`` is called about every half second while no message comes.
        Setup notes are kept in ``setup_note``, not yielded."""
        limit = deadline if callable(deadline) else (lambda: float(deadline))
        while self._conn is None:
            if not process.running() or time.monotonic() > limit():
                return
            try:
                self._conn, _ = self._server.accept()
            except TimeoutError:
                continue
            self._conn.settimeout(0.5)
        while time.monotonic() <= limit():
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                try:
                    message = json.loads(line)
                except ValueError:
                    message = None
                if not isinstance(message, dict):   # the runner fails the trial on it
                    message = {"type": None, "line": line[:200].decode(errors="replace")}
                if message.get("type") == "setup":
                    self.setup_note, self.setup_note_at = message, time.monotonic()
                    continue
                yield message
            try:
                chunk = self._conn.recv(65536)
            except TimeoutError:
                if not process.running():
                    return
                if idle is not None:
                    idle()
                continue
            except OSError:
                return
            if not chunk:
                return
            self._buffer += chunk

    @property
    def connected(self) -> bool:
        """Whether the trainer has connected (a request before then would be lost)."""
        return self._conn is not None

    def request(self, name: str) -> None:
        """Sends an unsolicited request (``checkpoint``) that the trainer acts on at its next
        step."""
        self.reply({"request": name})

    def reply(self, message: dict[str, Any]) -> None:
        if self._conn is None:
            return
        try:
            self._conn.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            return  # the trainer is gone; its exit code tells the rest

    def close(self) -> None:
        for s in (self._conn, self._server):
            if s is not None:
                s.close()
