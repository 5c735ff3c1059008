"""The study server's control loop: every fraction of a heartbeat it gives up the workers of
each live study that have gone silent and queues their trials to resume from their last
checkpoint on another worker (``control.recover``), minding its own stalls and the database's
outages so no live worker is given up for a beat that could not land."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from . import record
from .control import RECONNECT_GRACE

__all__ = ["ControlLoop", "DEFAULT_HEARTBEAT_S"]

DEFAULT_HEARTBEAT_S = 10.0


class ControlLoop:
    """Recovers the trials of silent workers, study by study, every fraction of a beat."""

    def __init__(self, registry: Any, storage: Any, echo: Callable[[str], None]) -> None:
        from .db import utcnow

        self.registry = registry
        self.storage = storage
        self.echo = echo
        self.started = utcnow() + RECONNECT_GRACE
        self._beats: dict[str, float] = {}
        self._guards: dict[str, Any] = {}     # study: StallGuard
        self._outage = False
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="autotune-control")

    def heartbeat_s(self, study: str) -> float:
        if study not in self._beats:
            try:
                study_id = self.storage.get_study_id_from_name(study)
                config = self.storage.get_study_user_attrs(study_id).get(record.STUDY_CONFIG, {})
                self._beats[study] = float(config.get("heartbeat_s", DEFAULT_HEARTBEAT_S))
            except KeyError:
                return DEFAULT_HEARTBEAT_S
        return self._beats[study]

    def once(self, due: float | None = None) -> float:
        """One pass over the live studies (``due``: the monotonic time it was meant to start);
        the seconds until the next one."""
        from .control import LATE_S, StallGuard, recover, stall_grace
        from .db import utcnow

        period, now = 1.0, time.monotonic()
        studies = self.registry.live_studies()
        if due is not None and now - due > LATE_S and studies:
            self.echo(f"autotune server: the control loop ran {now - due:.1f} s late (this "
                      "machine stalled); no worker is given up until their heartbeats land")
        if self._outage:  # the database is back: heartbeats sent meanwhile were lost, so
            self._outage = False          # every worker gets time to beat again
            self.started = utcnow() + RECONNECT_GRACE
            return period
        for study in studies:
            beat = self.heartbeat_s(study)
            period = min(period, beat / 4)
            guard = self._guards.setdefault(study, StallGuard())
            if guard.may_recover(now, due, stall_grace(beat)):
                recover(self.registry, self.storage, study, beat, self.started, self.echo)
        return max(period, 0.1)

    def _run(self) -> None:
        wait = 1.0
        while True:
            due = time.monotonic() + wait
            if self._stop.wait(wait):
                return
            try:
                wait = self.once(due)
            except Exception as e:  # noqa: BLE001 - the database is away; try again soon
                self._outage = True
                self.echo(f"autotune server: control loop: {type(e).__name__}: "
                          f"{' '.join(str(e).split())[:200]}")
                wait = 2.0

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
