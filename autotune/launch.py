"""Starting a trainer with the ``deepspeed`` launcher, and the report channel it talks to."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil

from trainers import protocol

from ._ops import extensions_dir
from .errors import LaunchError

__all__ = ["deepspeed_command", "free_port", "keep_going", "multinode_commands",
           "sweep_orphaned_shm_buffers", "read_hostfile", "run_plan", "serve_plans",
           "ReportChannel", "TrainerProcess", "WarmRanks", "trainer_path"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def bundled_trainers() -> list[str]:
    """The trainer programs a worker runs: the runnable modules of ``trainers/``."""
    import trainers

    return sorted(p.stem for p in Path(trainers.__file__).parent.glob("*.py")
                  if not p.stem.startswith("_") and "__main__" in p.read_text())


def trainer_path(program: str) -> Path:
    """The script of the trainer ``program``: a module of ``trainers/``, named, never a path
    (a study config, from a file or the study store, cannot make a worker run another file)."""
    import trainers

    found = bundled_trainers()
    if program not in found:
        raise LaunchError(f"trainer.program {program!r} is not a trainer this worker runs; "
                          f"it runs the modules of trainers/: {', '.join(found)}")
    return Path(trainers.__file__).parent / f"{program}.py"


def _deepspeed_executable() -> str:
    local = Path(sys.executable).parent / "deepspeed"
    found = str(local) if local.is_file() else shutil.which("deepspeed")
    if not found:
        raise LaunchError("the `deepspeed` launcher is not installed; run `pip install deepspeed`")
    return found


def deepspeed_command(script: Path, plan_path: Path, report_to: str, *, ranks: int,
                      master_port: int) -> list[str]:
    """The launcher command that starts ``ranks`` local ranks of ``script``.

    It is the command DeepSpeed's ``deepspeed`` runner builds for one node, run directly: the
    runner only writes it and waits, and its own start (Python, torch, DeepSpeed) costs every
    trial seconds on a CPU."""
    world = base64.urlsafe_b64encode(json.dumps({"localhost": list(range(ranks))}).encode())
    return [sys.executable, "-u", "-m", "trainers._launch",
            f"--world_info={world.decode()}", "--master_addr=127.0.0.1",
            f"--master_port={master_port}", str(script), "--plan", str(plan_path),
            "--report-to", report_to]


def read_hostfile(path: Path) -> list[tuple[str, int]]:
    """(host, slots) per line of a DeepSpeed hostfile (``host slots=N``), in order."""
    hosts = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        slots = [p for p in parts[1:] if p.startswith("slots=")]
        if len(parts) != 2 or not slots or not slots[0][6:].isdigit() or int(slots[0][6:]) < 1:
            raise LaunchError(f"{path}:{number}: {raw.strip()!r} is not 'HOST slots=N'")
        hosts.append((parts[0], int(slots[0][6:])))
    if not hosts:
        raise LaunchError(f"{path}: no hosts; write one 'HOST slots=N' line per node")
    return hosts


def multinode_commands(script: Path, plan_path: Path, report_to: str, *, hostfile: Path,
                       master_addr: str, master_port: int, ssh: bool) -> list[list[str]]:
    """The launcher commands for a trial across the nodes of ``hostfile``.

    With ``ssh``, one command, run on the first node: DeepSpeed's runner reaches every node
    over ssh (pdsh). Without it, one command per node, each started on its own node
    (``--no_ssh --node_rank I``); node 0 hosts rank 0 and the rendezvous at ``master_addr``.
    """
    hosts = read_hostfile(hostfile)
    base = [_deepspeed_executable(), "--hostfile", str(hostfile), "--master_addr", master_addr,
            "--master_port", str(master_port)]
    tail = [str(script), "--plan", str(plan_path), "--report-to", report_to]
    if ssh:
        return [[*base, "--launcher", "pdsh", *tail]]
    return [[*base, "--no_ssh", "--node_rank", str(rank), *tail] for rank in range(len(hosts))]


def trainer_env(device: str, threads_per_rank: int, *, shadow_mlflow: bool = True
                ) -> dict[str, str]:
    """The environment of the launcher and ranks. ``shadow_mlflow``: MLflow cannot be imported
    there (trainers/_no_mlflow), which saves DeepSpeed's needless import of it, about 2 s of
    CPU in each process at every trial's start (benchmarks/trial_startup.py)."""
    # The study server's secret stays with the worker: trainers never talk to the server.
    env = {k: v for k, v in os.environ.items()
           if k not in ("AUTOTUNE_SERVER_TOKEN", "AUTOTUNE_SERVER_TOKEN_FILE")}
    root = Path(__file__).resolve().parent.parent
    paths = [str(root / "trainers" / "_no_mlflow")] if shadow_mlflow else []
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*paths, str(root),
                                                    env.get("PYTHONPATH", "")) if p)
    env["OMP_NUM_THREADS"] = str(threads_per_rank)
    # The launcher and ranks import nothing from the folder they were started in (a stray
    # inspect.py there would crash every trial): Python 3.11's safe path.
    env["PYTHONSAFEPATH"] = "1"
    # DeepSpeed's compiled CPU op lives in this environment's own folder, not in the one
    # every environment shares behind one lock (autotune._ops).
    env["TORCH_EXTENSIONS_DIR"] = extensions_dir()
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    return env


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
                message = json.loads(line)
                if isinstance(message, dict) and message.get("type") == "setup":
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


class WarmRanks:
    """A trainer's launcher, ranks and report channel, kept between a worker's trials.

    The ranks were started with ``--serve``: after each trial they say ``ready`` and wait, and
    the next plan goes to them over the channel instead of to a new launch, which saves the
    launcher, interpreters, imports and process group at every trial (trainers/image_classifier
    documents the protocol). Their output goes to one log; each trial's share of it is copied
    to that trial's ``trainer.log``."""

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
            with open(self.process.log_path, "rb") as log, open(to, "ab") as out:
                log.seek(self._log_at)
                out.write(log.read())
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
    plan_path = folder / "plan.json"
    plan_path.write_text(json.dumps(plan))
    channel = ReportChannel()
    command = deepspeed_command(trainer_path(program), plan_path, channel.address,
                                ranks=int(plan["world_size"]), master_port=free_port())
    process = TrainerProcess(command, trainer_env(device, threads_per_rank,
                                                  shadow_mlflow=shadow_mlflow),
                             folder / "trainer.log")
    messages = []
    try:
        for message in channel.messages(process, time.monotonic() + timeout_s):
            messages.append(message)
            channel.reply(protocol.ACK if message.get("type") == "end"
                          else answer(message))
            if on_message is not None:
                on_message(message, channel, process)
    finally:
        channel.close()
        process.wait(ended=any(m.get("type") == "end" for m in messages))
    return messages, process


def serve_plans(plans: Iterable[dict[str, Any]], folder: Path, *, device: str = "cpu",
                threads_per_rank: int = 1, timeout_s: float = 600,
                program: str = "image_classifier"
                ) -> Iterator[tuple[list[dict[str, Any]], float]]:
    """Runs ``plans`` one after another in warm trainer ranks, as a worker runs its trials
    (see ``WarmRanks``), letting each go on to its end; yields each plan's messages and its
    wall seconds from the hand-over (or the launch) to its end. Ranks that fail a plan are
    replaced by a fresh launch for the next. For benchmarks and tests."""
    folder.mkdir(parents=True, exist_ok=True)
    ranks: WarmRanks | None = None
    try:
        for number, plan in enumerate(plans):
            start = time.perf_counter()
            if ranks is not None and not ranks.hand(plan):
                ranks.close(kill=True)
                ranks = None
            if ranks is None:
                plan_path = folder / f"plan-{number}.json"
                plan_path.write_text(json.dumps(plan))
                channel = ReportChannel()
                command = [*deepspeed_command(trainer_path(program), plan_path,
                                              channel.address, ranks=int(plan["world_size"]),
                                              master_port=free_port()), "--serve"]
                process = TrainerProcess(command, trainer_env(device, threads_per_rank),
                                         folder / f"ranks-from-{number}.log")
                ranks = WarmRanks(channel, process, number)
            messages: list[dict[str, Any]] = []
            for message in ranks.channel.messages(ranks.process, time.monotonic() + timeout_s):
                messages.append(message)
                ended = message.get("type") == "end"
                ranks.channel.reply(protocol.ACK if ended else keep_going(message))
                if ended:
                    break
            wall = time.perf_counter() - start
            if not messages or messages[-1].get("type") != "end" \
                    or protocol.leaves_after(messages[-1].get("reason")):
                ranks.close(kill=True)
                ranks = None
            yield messages, wall
    except GeneratorExit:          # closed between plans: the ranks wait, and leave
        raise
    except BaseException:          # interrupted mid-plan: the ranks go with it
        if ranks is not None:
            ranks.close(kill=True)
            ranks = None
        raise
    finally:
        if ranks is not None:
            ranks.close()
