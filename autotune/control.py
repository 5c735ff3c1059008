"""Crash safety: the worker registry, heartbeats, and recovery of trials whose worker died.

A worker registers with the study's registry (autotune's tables, :mod:`autotune.db`) and
beats every ``heartbeat_s``. Each trial it runs is an *attempt* on record, with the newest
checkpoint the trainer reported. A worker silent for 1.5 heartbeats is given up: each of its
running attempts is claimed by exactly one recoverer, its Optuna trial is failed with the
reason ``worker_lost``, and its configuration is queued again with the checkpoint, so the next
free worker resumes it (same parameters, lineage recorded, the clock continuing from the
checkpoint, the downtime recorded). Trials RUNNING in Optuna with no attempt on record (a
worker that died between taking a trial and recording it) are failed and queued afresh once a
recoverer has seen them so for 6 heartbeats on its own clock (Optuna's start stamps come from
the clock of the machine that took the trial), so no trial stays RUNNING forever.

Who recovers: the study server's control loop when workers use one (``autotune://``); with
a direct database URL, every worker's heartbeat thread and the waiting ``start study``.
Workers behind a study server reach the registry through the server's control channel (JSON
over the same gRPC port); calls that fail while the server is away are kept and sent again.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import optuna
from optuna.trial import TrialState

from . import record
from ._channel import is_server_url, parse_address
from .db import Registry, utcnow

__all__ = ["ControlClient", "StallGuard", "WorkerSession", "add_control_service", "recover",
           "registry_for", "stall_grace", "LATE_S", "STALE_BEATS", "worker_name"]

log = logging.getLogger("autotune")
STALE_BEATS = 1.5          # silent this many heartbeats: given up
# After the server starts, or the registry comes back from an outage, workers get this long
# (besides the usual 1.5 heartbeats) to reconnect and beat before any is given up.
RECONNECT_GRACE = timedelta(seconds=10)
ORPHAN_BEATS = 6.0         # RUNNING with no attempt on record this many heartbeats: given up
LATE_S = 1.0               # a recoverer this late for its own next check was itself stalled
_METHOD = "/autotune.Control/Call"
_CALLS = ("register", "heartbeat", "stop_worker", "attempt", "workers", "attempts", "forget")


def worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


# -- the control channel ----------------------------------------------------------------------
def add_control_service(server: Any, registry: Registry) -> None:
    """Serves ``registry``'s calls on ``server`` (a grpc.Server, before it starts)."""
    import grpc

    def call(request: bytes, context: Any) -> bytes:
        try:
            message = json.loads(request)
        except (ValueError, RecursionError):
            message = None
        args = message.get("args", {}) if isinstance(message, dict) else None
        if not isinstance(message, dict) or not isinstance(args, dict):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          'a control call is a JSON object {"method": NAME, "args": {...}}')
            return b""      # (abort raised)
        name = message.get("method")
        if not isinstance(name, str) or name not in _CALLS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"no control call {name!r}"[:300])
            return b""
        method = getattr(registry, name)
        try:
            inspect.signature(method).bind(**args)
        except TypeError as e:     # a client not autotune's: told, not retried as an outage
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"control call {name}: {e}"[:300])
        try:
            result = method(**args)
        except Exception as e:  # noqa: BLE001 - the database is away: the worker retries
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{type(e).__name__}: {e}"[:300])
        return json.dumps(result).encode()

    handler = grpc.method_handlers_generic_handler("autotune.Control", {
        "Call": grpc.unary_unary_rpc_method_handler(call)})
    server.add_generic_rpc_handlers((handler,))


class NoControlChannel(RuntimeError):
    """The server answers Optuna's storage calls but not autotune's control channel."""


class ControlClient:
    """The registry's calls, made on a study server's control channel."""

    def __init__(self, host: str, port: int, timeout_s: float = 10.0) -> None:
        from ._channel import Address, open_channel

        self._address = f"{host}:{port}"
        self._channel = open_channel(Address(host, port))
        self._call = self._channel.unary_unary(_METHOD)
        self._timeout_s = timeout_s

    def _remote(self, method: str, **args: Any) -> Any:
        import grpc

        try:
            reply = self._call(json.dumps({"method": method, "args": args}).encode(),
                               timeout=self._timeout_s)
        except grpc.RpcError as e:
            code = e.code() if callable(getattr(e, "code", None)) else None
            if code == grpc.StatusCode.UNIMPLEMENTED:   # Optuna's own gRPC proxy
                raise NoControlChannel(
                    f"the server at {self._address} answers Optuna's storage calls but has no "
                    "control channel: it is a plain Optuna storage proxy, not `autotune "
                    "server`") from None
            raise
        return json.loads(reply)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in _CALLS:
            raise AttributeError(name)
        return lambda **args: self._remote(name, **args)

    def close(self) -> None:
        self._channel.close()


def registry_for(storage_url: str) -> Any:
    """The registry of the study store ``storage_url``: its tables, or a study server's
    control channel."""
    if is_server_url(storage_url):
        address = parse_address(storage_url)
        return ControlClient(address.host, address.port)
    return Registry(storage_url)


# -- recovery ---------------------------------------------------------------------------------
class StallGuard:
    """Whether a recoverer may give anyone up now: not right after it was stalled itself.

    When a whole machine stalls for seconds (two trials starting on loaded cores, a burst of
    disk writes holding up the database's commits), the recoverer's clock runs on while every
    heartbeat waits: in a worker's process, in the study server, in the database. Judged on
    waking, live workers look silent. So a recoverer that wakes more than ``LATE_S`` after it
    was due holds its judgement for ``grace_s``, while the delayed beats land. A pure decision
    on the times it is given."""

    def __init__(self) -> None:
        self._hold_until = -math.inf

    def may_recover(self, now: float, due: float | None, grace_s: float) -> bool:
        """``now``: a monotonic time; ``due``: when this check was meant to run (None: no
        schedule to be late for)."""
        if due is not None and now - due > LATE_S:
            self._hold_until = max(self._hold_until, now + grace_s)
        return now >= self._hold_until


def stall_grace(heartbeat_s: float) -> float:
    """How long a stalled recoverer holds its judgement: half a beat, at least 2 s."""
    return max(2.0, heartbeat_s / 2)


def recover(registry: Registry, storage: Any, study_name: str, heartbeat_s: float,
            alive_since: datetime, echo: Callable[[str], None] | None = None) -> list[int]:
    """Gives up ``study_name``'s silent workers and queues their trials to resume; returns
    the trial numbers recovered."""
    recovered = []
    for lost in registry.claim_lost(study_name, STALE_BEATS * heartbeat_s, alive_since):
        try:
            if _requeue(storage, lost):
                recovered.append(int(lost["trial_number"]))
                if echo:
                    where = lost["checkpoint_path"] or "the start"
                    echo(f"worker {lost['worker']} is lost; trial {lost['trial_number']} "
                         f"resumes from {where}")
        except Exception as e:  # noqa: BLE001 - retried by the orphan sweep below
            log.warning("could not requeue trial %s of %s: %s", lost["trial_number"],
                        study_name, e)
    recovered += _sweep_orphans(registry, storage, study_name, ORPHAN_BEATS * heartbeat_s)
    return recovered


def _requeue(storage: Any, lost: dict[str, Any]) -> bool:
    """Fails the lost attempt's trial and queues its configuration with its checkpoint."""
    study_id = storage.get_study_id_from_name(lost["study"])
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, lost["trial_number"])
    trial = storage.get_trial(trial_id)
    if trial.state != TrialState.RUNNING:
        return False                               # it was told before the worker died
    checkpoint = lost.get("checkpoint_path")
    detail = lost.get("detail") or (
        f"worker {lost['worker']} stopped sending heartbeats; the trial resumes from "
        f"{'its checkpoint ' + checkpoint if checkpoint else 'the start'}")
    attrs: dict[str, Any] = {record.OUTCOME: "failed", record.STOP_REASON: "worker_lost",
                             record.DETAIL: detail}
    if checkpoint:   # the registry's record is the latest; the worker's own write may be lost
        attrs.update({record.CHECKPOINT: checkpoint,
                      record.CHECKPOINT_ELAPSED: lost.get("elapsed_s")})
    for key, value in attrs.items():
        storage.set_trial_user_attr(trial_id, key, value)
    storage.set_trial_state_values(trial_id, TrialState.FAIL)
    queued = {**record.resumption(trial.user_attrs.get(record.LINEAGE, []), trial.number,
                                  checkpoint, lost.get("elapsed_s"),
                                  float(lost["last_heartbeat"])),
              record.LOST_WORKER: lost["worker"], record.LOST_RUN_KEY: f"trial-{trial.number}"}
    study = optuna.load_study(study_name=lost["study"], storage=storage)
    study.enqueue_trial(dict(trial.params), user_attrs=queued, skip_if_exists=False)
    return True


# When each RUNNING trial with no attempt on record was first seen by this process (a
# monotonic time), keyed by study, trial number and Optuna's start stamp.
_ORPHANS_SEEN: dict[tuple[str, int, str], float] = {}
_ORPHANS_LOCK = threading.Lock()
# Optuna stamps a trial's start with the clock of the machine that took it; a stamp older
# than this beyond the sweep's wait is old even on a machine whose clock is badly off.
STAMP_DOUBT_S = 3600.0


def _sweep_orphans(registry: Registry, storage: Any, study_name: str, after_s: float,
                   clock: Callable[[], float] = time.monotonic) -> list[int]:
    """RUNNING trials with no attempt on record for ``after_s``: failed, queued.

    How long is judged on this process's own clock, from when it first saw the trial without
    an attempt: Optuna's start stamp comes from the clock of whichever machine took the trial,
    and a worker whose clock ran a minute behind this one's had its trial swept the moment it
    was taken (and trained it twice). A stamp older than ``after_s`` plus ``STAMP_DOUBT_S``
    is old on any clock: such a trial (left by a study stopped long ago) goes at once.
    """
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return []
    running = storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
    recorded = registry.attempt_numbers(study_name) if running else set()
    waiting = [t for t in running if t.number not in recorded
               and not record.asked_elsewhere(t)]          # another client's: left to it
    now, local = clock(), datetime.now()
    old = []
    with _ORPHANS_LOCK:
        keys = {(study_name, t.number, str(t.datetime_start)): t for t in waiting}
        for key in [k for k in _ORPHANS_SEEN if k[0] == study_name and k not in keys]:
            del _ORPHANS_SEEN[key]              # recorded, finished, or taken by another
        for key, trial in keys.items():
            first = _ORPHANS_SEEN.setdefault(key, now)
            stamped = (None if trial.datetime_start is None else
                       (local - trial.datetime_start.replace(tzinfo=None)).total_seconds())
            if now - first >= after_s or (stamped is not None
                                          and stamped > after_s + STAMP_DOUBT_S):
                old.append(trial)
    swept = []
    for trial in old:
        taker = trial.user_attrs.get(record.ASKED_BY)
        lost = {"study": study_name, "trial_number": trial.number, "worker": "unknown",
                "checkpoint_path": None, "last_heartbeat": time.time(),
                "detail": f"{'worker ' + str(taker) if taker else 'a worker'} took it and "
                          f"recorded no attempt of it within {after_s:.0f} s (a worker records "
                          "one as it starts a trial); the trial starts afresh"}
        if _requeue(storage, lost):
            swept.append(trial.number)
    return swept


# -- a worker's side --------------------------------------------------------------------------
class WorkerSession:
    """One worker process on the registry: registration, heartbeats, its attempts.

    Calls that fail (a study server restarting) are kept in order and sent again by the
    heartbeat thread, so the registry ends up with every record once. With ``recover_with``
    (direct database access), the heartbeat thread also recovers other workers' lost trials.
    """

    def __init__(self, registry: Any, study_name: str, heartbeat_s: float,
                 recover_with: Any = None, name: str | None = None) -> None:
        self.registry = registry
        self.study_name = study_name
        self.name = name or worker_name()
        self.heartbeat_s = heartbeat_s
        self._recover_with = recover_with
        self._pending: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.lost = threading.Event()      # the registry gave this worker up (at least once)
        self._started = utcnow()
        self._guard = StallGuard()
        self._missed = False
        self._said_no_channel = False
        self._send("register", name=self.name, study=study_name, host=socket.gethostname(),
                   pid=os.getpid())
        self._thread = threading.Thread(target=self._beat, daemon=True, name="autotune-beat")
        self._thread.start()

    def _send(self, method: str, **args: Any) -> None:
        with self._lock:
            self._pending.append((method, args))
        self._flush()

    def _flush(self, wait: bool = True) -> bool:
        """Delivers the deferred records in order; without ``wait``, True at once when another
        thread is delivering them."""
        if not self._lock.acquire(blocking=wait):
            return True
        try:
            while self._pending:
                method, args = self._pending[0]
                try:
                    getattr(self.registry, method)(**args)
                except NoControlChannel as e:   # kept too; said once, it will not change
                    if not self._said_no_channel:
                        self._said_no_channel = True
                        log.warning("autotune: warning: %s; this worker's heartbeats are not "
                                    "recorded, so a trial it leaves when it dies is not "
                                    "resumed elsewhere: serve the study with `autotune server "
                                    "--storage URL`", e)
                    return False
                except Exception as e:  # noqa: BLE001 - kept; sent again with the next beat
                    log.debug("registry call %s deferred: %s", method, e)
                    return False
                self._pending.pop(0)
            return True
        finally:
            self._lock.release()

    def _beat(self) -> None:
        # A steady cadence: a slow call delays one beat, not every later one.
        next_at = time.monotonic() + self.heartbeat_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            due, next_at = next_at, max(next_at + self.heartbeat_s, time.monotonic())
            self.beat_once(due)

    def beat_once(self, due: float | None = None) -> None:
        """One beat; ``due``: when it was meant to go (a late one recovers no one)."""
        registered = not any(method == "register" for method, _ in self._pending)
        try:
            # The beat goes first, not behind deferred records or a call the worker's main
            # thread is making: under load, waiting for those made live workers look lost.
            status = (self.registry.heartbeat(name=self.name).get("status") if registered
                      else "unknown")
        except Exception as e:  # noqa: BLE001 - the next beat tries again
            log.debug("heartbeat failed: %s", e)
            self._missed = True
            return
        if not self._flush(wait=False):
            self._missed = True
            return
        if status == "unknown" and not registered:
            return                         # its registration just went through
        if self._missed:  # the registry was away: other workers' beats were lost too, so
            self._missed = False          # give them time to beat again before recovering
            self._started = utcnow() + RECONNECT_GRACE
            return
        if status == "lost":
            # Given up while alive (its beats came late): its running trial was failed and
            # queued to resume elsewhere, and the trainer stops at its next report. The worker
            # registers again, or every trial it takes from now on would be given up too.
            log.warning("worker %s was given up as lost (its heartbeats came late); its trial "
                        "resumes elsewhere, and it goes on with the next", self.name)
            self.lost.set()
            self._send("register", name=self.name, study=self.study_name,
                       host=socket.gethostname(), pid=os.getpid())
        elif status == "unknown":   # the registry was emptied: register again
            self._send("register", name=self.name, study=self.study_name,
                       host=socket.gethostname(), pid=os.getpid())
        if self._recover_with is not None and self._guard.may_recover(
                time.monotonic(), due, stall_grace(self.heartbeat_s)):
            patience = getattr(self._recover_with, "patience", None)
            try:
                with patience(0) if patience else contextlib.nullcontext():
                    recover(self.registry, self._recover_with, self.study_name,
                            self.heartbeat_s, self._started)
            except Exception as e:  # noqa: BLE001 - the next beat tries again
                log.debug("recovery failed: %s", e)

    def attempt(self, trial_number: int, attempt: int, **fields: Any) -> None:
        self._send("attempt", study=self.study_name, trial_number=trial_number,
                   attempt=attempt, worker=self.name, **fields)

    def close(self, timeout_s: float = 30.0) -> bool:
        """Stops beating and says so; True if every record reached the registry."""
        self._stop.set()
        self._thread.join()
        self._send("stop_worker", name=self.name)
        deadline = time.monotonic() + timeout_s
        while not self._flush() and time.monotonic() < deadline:
            time.sleep(1.0)
        return not self._pending
