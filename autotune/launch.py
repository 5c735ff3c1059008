"""The commands that start a trainer under the ``deepspeed`` launcher, and its environment.

The processes they start and the channel rank 0 reports on are ``autotune._process``; a
worker's ranks, kept warm between trials or launched anew, are ``autotune.ranks``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import sys
from pathlib import Path

from ._ops import extensions_dir
from .errors import LaunchError

__all__ = ["bundled_trainers", "deepspeed_command", "free_port", "multinode_commands",
           "read_hostfile", "trainer_env", "trainer_path"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def bundled_trainers() -> list[str]:
    """The trainer programs of ``trainers/`` (``programs.bundled``)."""
    from .programs import bundled

    return bundled()


def trainer_path(program: str) -> Path:
    """The script a worker launches for ``program``: a bundled trainer's module, or the
    absolute path of a study's own script (``programs.script_of``)."""
    from .programs import script_of

    return script_of(program)


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
    hosts: list[tuple[str, int]] = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        # DeepSpeed's own reading: the host, then slots=N; what follows (OpenMPI's
        # max_slots=M) is left alone, as its runner leaves it
        match = re.match(r"^(\S+)\s+slots=(\d+)(\s|$)", line)
        if match is None or int(match.group(2)) < 1:
            raise LaunchError(f"{path}:{number}: {raw.strip()!r} is not 'HOST slots=N'"
                              f"{_hostfile_hint(line)}")
        host, slots = match.group(1), int(match.group(2))
        if any(host == h for h, _ in hosts):
            raise LaunchError(f"{path}:{number}: {host} is listed twice; give each node one "
                              "line, with all its slots")
        hosts.append((host, slots))
    if not hosts:
        raise LaunchError(f"{path}: no hosts; write one 'HOST slots=N' line per node")
    return hosts


def _hostfile_hint(line: str) -> str:
    """What the hostfile line ``line``, written for another launcher, means in DeepSpeed's."""
    first = line.split()[0]
    if re.fullmatch(r"[^\s:]+:\d+", first):                      # MPICH's host:N
        host, _, n = first.rpartition(":")
        return f" (MPICH's form): write '{host} slots={n}'"
    if "[" in first and "]" in first:                            # Slurm's node list
        return (" (a Slurm node list): expand it (scontrol show hostnames) and write one "
                "'HOST slots=N' line per node")
    if len(line.split()) == 1:
        return f": write '{first} slots=N', N the ranks (GPUs) on that node"
    return ""


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


def trainer_env(device: str, threads_per_rank: int, *, shadow_mlflow: bool = True,
                program: str | None = None) -> dict[str, str]:
    """The environment of the launcher and ranks. ``shadow_mlflow``: MLflow cannot be imported
    there (trainers/_no_mlflow), which saves DeepSpeed's needless import of it, about 2 s of
    CPU in each process at every trial's start (benchmarks/trial_startup.py); a study's own
    script (``program``, an absolute path) may import MLflow, and its folder is importable."""
    # The study server's secret stays with the worker: trainers never talk to the server.
    env = {k: v for k, v in os.environ.items()
           if k not in ("AUTOTUNE_SERVER_TOKEN", "AUTOTUNE_SERVER_TOKEN_FILE")}
    root = Path(__file__).resolve().parent.parent
    own = program is not None and Path(program).is_absolute()
    paths = [str(root / "trainers" / "_no_mlflow")] if shadow_mlflow and not own else []
    if own:
        paths.append(str(Path(str(program)).parent))
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
