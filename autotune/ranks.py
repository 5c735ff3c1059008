"""The trainer ranks a worker runs its trials on: warm ranks that serve one trial after another,
or a fresh launch for each.

Warm ranks save the launcher, the interpreters, the imports and the process group at every
trial. The worker asks for them in the plan (``serve``); the trainer's start report says
whether its ranks will wait for another plan (``serves``: a program that does not know the key
simply runs each trial in a fresh launch), and ranks leave after a trial that ended
checkpointed or out of memory (``trainers.protocol.ranks_stay``). A worker thread owns one
:class:`Ranks`; ``run_plan`` and ``serve_plans`` (benchmarks and tests) run plans the same way.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainers import protocol

from ._process import ReportChannel, TrainerProcess
from .errors import AutotuneError
from .launch import (
    deepspeed_command,
    free_port,
    multinode_commands,
    read_hostfile,
    trainer_env,
    trainer_path,
)

__all__ = ["WARM_TRIALS_MAX", "Launched", "Ranks", "WarmRanks", "keep_going", "local_command",
           "run_plan", "serve_plans", "trial_command"]

log = logging.getLogger("autotune")

# Warm trainer ranks are replaced after this many trials: whatever a long-lived process
# accumulates (allocator fragmentation, a library's caches) stays bounded.
WARM_TRIALS_MAX = 100

# plan path -> the report channel and the launcher command of a trial
Command = Callable[[Path], tuple[ReportChannel, list[str]]]


class WarmRanks:
    """A trainer's launcher, ranks and report channel, kept between a worker's trials.

    After each trial the ranks say ``ready`` and wait, and the next plan goes to them over the
    channel instead of to a new launch (trainers/image_classifier documents the protocol).
    Their output goes to one log; each trial's share of it is copied to that trial's
    ``trainer.log``."""

    def __init__(self, channel: ReportChannel, process: TrainerProcess, started_for: int
                 ) -> None:
        self.channel, self.process, self.started_for = channel, process, started_for
        self.trials = 1                   # trials these ranks have been given
        self._log_at = 0                  # where the current trial's output starts in the log

    def hand(self, plan: dict[str, Any], wait_s: float = 30.0) -> bool:
        """Gives ``plan`` to the waiting ranks; False when they are gone, or say anything but
        ``ready`` within ``wait_s``."""
        for message in self.channel.messages(self.process, time.monotonic() + wait_s):
            # a "ready" said before the ranks died can still wait in the channel's buffer
            if message.get("type") != "ready" or self.process.proc.poll() is not None:
                return False
            self._log_at = self._log_size()
            self.channel.reply(protocol.plan_reply(plan))
            self.trials += 1
            return True
        return False

    def _log_size(self) -> int:
        try:
            return self.process.log_path.stat().st_size
        except OSError:
            return 0

    def copy_log(self, to: Path) -> None:
        """Appends the current trial's output to ``to``."""
        try:
            with open(self.process.log_path, "rb") as log_file, open(to, "ab") as out:
                log_file.seek(self._log_at)
                out.write(log_file.read())
        except OSError:
            pass   # a log is a convenience: never a reason to fail a trial

    def close(self, *, kill: bool = False) -> int:
        """Lets waiting ranks leave (``exit``); stops them if they are not waiting (a trial
        still running, or ranks leaving on their own), or with ``kill``. Returns the
        launcher's exit code."""
        if not kill and self.process.running():
            kill = True
            for message in self.channel.messages(self.process, time.monotonic() + 5.0):
                if message.get("type") == "ready":
                    self.channel.reply(protocol.EXIT)
                    kill = False
                break
        self.channel.close()
        if kill:
            self.process.kill()
            return self.process.wait()
        return self.process.wait(30.0, ended=True)


@dataclass
class Launched:
    """A trial's trainer: its channel and process, and the ranks when they may serve on."""

    channel: ReportChannel
    process: TrainerProcess
    warm: WarmRanks | None = None


class Ranks:
    """One worker thread's trainer ranks: :meth:`start` hands a trial to the warm ranks kept
    from the last one, or launches anew; :meth:`finish` keeps ranks that will serve the next
    trial and stops the others; :meth:`close` lets kept ranks leave.

    ``command(plan_path)`` builds the launch; ``serve`` asks the ranks to wait for more plans;
    ``log_dir`` holds the logs of ranks that serve (each trial's folder gets its share);
    ``before_launch`` runs before every fresh launch (building DeepSpeed's CPU op once)."""

    def __init__(self, command: Command, env: dict[str, str], *, serve: bool, log_dir: Path,
                 before_launch: Callable[[], None] | None = None,
                 max_trials: int = WARM_TRIALS_MAX) -> None:
        self.command, self.env, self.serve = command, env, serve
        self.log_dir, self.before_launch, self.max_trials = log_dir, before_launch, max_trials
        self.warm: WarmRanks | None = None

    def start(self, number: int, plan: dict[str, Any], folder: Path) -> Launched:
        """Trial ``number``'s trainer. Writes ``folder``/plan.json (the plan, with ``serve``),
        the launch command and the trial's ``trainer.log`` (or where the ranks' log is)."""
        plan = {**plan, "serve": self.serve}
        plan_path = folder / "plan.json"
        plan_path.write_text(json.dumps(plan, indent=2))
        warm, self.warm = self.warm, None
        log_file = folder / "trainer.log"
        if warm is not None:
            if warm.hand(plan):
                note = f"# warm ranks started for trial {warm.started_for}"
                log_file.write_text(f"{note}, their trial {warm.trials}; their whole log: "
                                    f"{warm.process.log_path}\n")
                (folder / "command.txt").write_text(note + "\n")
                return Launched(warm.channel, warm.process, warm)
            log.info("the warm trainer ranks of trial %d are gone (exit code %s); trial %d "
                     "launches anew", warm.started_for, warm.process.proc.poll(), number)
            warm.close(kill=True)
        if self.before_launch is not None:
            self.before_launch()
        channel, command = self.command(plan_path)
        if self.serve:
            log_file = self.log_dir / f"from-trial-{number}.log"
            log_file.parent.mkdir(parents=True, exist_ok=True)
            (folder / "trainer.log").write_text(f"# trainer ranks started for this trial; "
                                                f"their whole log: {log_file}\n")
        (folder / "command.txt").write_text(" ".join(command) + "\n")
        try:
            process = TrainerProcess(command, self.env, log_file)
        except AutotuneError:
            channel.close()
            raise
        return Launched(channel, process, WarmRanks(channel, process, number)
                        if self.serve else None)

    def finish(self, launched: Launched, end: dict[str, Any] | None, folder: Path, *,
               serves: bool, keep: bool = True, grace: bool = False) -> int:
        """After a trial (``end``: its end report, None without one; ``serves``: what its start
        report said): ranks that stay (``protocol.ranks_stay``) are kept for the next trial,
        unless ``keep`` is false (the worker is stopping) or they have served ``max_trials``;
        others are stopped (with ``grace``, the trainer left the channel on its own: its ranks
        get a few seconds to exit with their own code first). Returns the exit code (0 for
        kept ranks)."""
        warm = launched.warm
        if warm is not None:
            warm.copy_log(folder / "trainer.log")
            if serves:
                if keep and protocol.ranks_stay(serves, end) and warm.trials < self.max_trials:
                    self.warm = warm
                    return 0
                return warm.close(kill=end is None)
        launched.channel.close()   # ranks that do not serve exit after their trial
        if end is None and grace:
            return launched.process.unheard_exit()
        if end is None:
            launched.process.kill()
        return launched.process.wait(ended=end is not None)

    def close(self) -> None:
        """Lets the kept ranks leave."""
        warm, self.warm = self.warm, None
        if warm is not None:
            warm.close()

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def local_command(program: str, ranks: int) -> Command:
    """Launches ``ranks`` ranks of ``program`` on this machine."""
    def command(plan_path: Path) -> tuple[ReportChannel, list[str]]:
        channel = ReportChannel()
        return channel, deepspeed_command(trainer_path(program), plan_path, channel.address,
                                          ranks=ranks, master_port=free_port())
    return command


def trial_command(program: str, ranks: int, hostfile: Path | None = None,
                  ranks_per_node: int | None = None) -> Command:
    """A worker's launches: ``ranks`` local ranks of ``program``, or across the nodes of a
    DeepSpeed ``hostfile`` (over ssh from this machine; rank 0 reports back to it by name)."""
    if hostfile is None:
        return local_command(program, ranks)

    def command(plan_path: Path) -> tuple[ReportChannel, list[str]]:
        channel = ReportChannel("0.0.0.0", advertise=socket.getfqdn())
        first = read_hostfile(hostfile)[0][0]
        launch = multinode_commands(trainer_path(program), plan_path, channel.address,
                                    hostfile=hostfile, master_addr=first,
                                    master_port=free_port(), ssh=True)[0]
        if ranks_per_node:
            launch[1:1] = ["--num_gpus", str(ranks_per_node)]
        return channel, launch
    return command


Answer = Callable[[dict[str, Any]], dict[str, Any]]


def keep_going(message: dict[str, Any]) -> dict[str, Any]:
    """The reply that lets a trainer go on, with no deadline."""
    return protocol.go()


def run_plan(plan: dict[str, Any], folder: Path, *, answer: Answer = keep_going,
             on_message: Callable[[dict[str, Any], ReportChannel, TrainerProcess], None]
             | None = None, device: str = "cpu", threads_per_rank: int = 1,
             timeout_s: float = 600, program: str = "image_classifier",
             shadow_mlflow: bool = True) -> tuple[list[dict[str, Any]], TrainerProcess]:
    """Runs ``plan`` on its ranks under the launcher, answering each report with ``answer``;
    returns every message and the (finished) process. For benchmarks and tests; the worker's
    own loop lives in ``autotune.trial_runner``."""
    folder.mkdir(parents=True, exist_ok=True)
    ranks = Ranks(local_command(program, int(plan["world_size"])),
                  trainer_env(device, threads_per_rank, shadow_mlflow=shadow_mlflow),
                  serve=False, log_dir=folder)
    launched = ranks.start(0, plan, folder)
    messages: list[dict[str, Any]] = []
    end = None
    try:
        for message in launched.channel.messages(launched.process,
                                                 time.monotonic() + timeout_s):
            messages.append(message)
            if message.get("type") == "end":
                end = message
            launched.channel.reply(protocol.ACK if end is not None else answer(message))
            if on_message is not None:
                on_message(message, launched.channel, launched.process)
    finally:
        launched.channel.close()
        launched.process.wait(ended=end is not None)
    return messages, launched.process


def serve_plans(plans: Iterable[dict[str, Any]], folder: Path, *, device: str = "cpu",
                threads_per_rank: int = 1, timeout_s: float = 600,
                program: str = "image_classifier"
                ) -> Iterator[tuple[list[dict[str, Any]], float]]:
    """Runs ``plans`` one after another in warm trainer ranks, as a worker runs its trials,
    letting each go on to its end; yields each plan's messages and its wall seconds from the
    hand-over (or the launch) to its end. Ranks that fail a plan are replaced by a fresh
    launch for the next. For benchmarks and tests."""
    folder.mkdir(parents=True, exist_ok=True)
    ranks: Ranks | None = None
    launched: Launched | None = None
    try:
        for number, plan in enumerate(plans):
            if ranks is None:
                ranks = Ranks(local_command(program, int(plan["world_size"])),
                              trainer_env(device, threads_per_rank), serve=True,
                              log_dir=folder / "ranks")
            start = time.perf_counter()
            plan_folder = folder / f"plan-{number}"
            plan_folder.mkdir(exist_ok=True)
            launched = ranks.start(number, plan, plan_folder)
            messages: list[dict[str, Any]] = []
            end, serves = None, False
            for message in launched.channel.messages(launched.process,
                                                     time.monotonic() + timeout_s):
                messages.append(message)
                kind = message.get("type")
                serves = bool(message.get("serves")) if kind == "start" else serves
                end = message if kind == "end" else None
                launched.channel.reply(protocol.ACK if end is not None
                                       else keep_going(message))
                if end is not None:
                    break
            wall = time.perf_counter() - start
            ranks.finish(launched, end, plan_folder, serves=serves)
            launched = None
            yield messages, wall
    except GeneratorExit:          # closed between plans: the ranks wait, and leave
        raise
    except BaseException:          # interrupted mid-plan: the ranks go with it
        if launched is not None and launched.warm is not None:
            launched.warm.close(kill=True)
        raise
    finally:
        if ranks is not None:
            ranks.close()
