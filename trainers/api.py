"""The trainer API: how a training script of your own takes part in an autotune study.

autotune's worker launches the script with DeepSpeed's launcher (one process per rank, with
``--plan PLAN.json --report-to HOST:PORT``). The script loops over its trials, trains, and
reports; the API keeps the clock, answers the worker, stops the trial when the worker or the
deadline says so, and checkpoints and resumes it::

    from trainers import api

    for trial in api.trials():              # one trial, or the next ones in the same ranks
        model = build(trial.params["dropout"])          # searched values, your own included
        optimizer = torch.optim.SGD(model.parameters(), lr=trial.lr(0))
        trial.checkpointing(save=lambda folder: ..., load=lambda folder: ...)
        trial.start()                       # resumes from a checkpoint if the plan says so
        while trial.running:
            for group in optimizer.param_groups:
                group["lr"] = trial.lr()
            loss = train_one_step(model, optimizer, trial.epoch, trial.step_in_epoch)
            if trial.step_done(loss):       # an evaluation is due
                trial.report(top1=evaluate(model))

What the API does for the script, by the rules the bundled trainer follows:

* **the plan** (``trial.plan``): the searched values (``trial.params``) and what the worker
  derived from them: global batch as micro-batch x accumulation x world size, steps per epoch
  and in all, peak LR and its schedule (``trial.lr(step)``), label smoothing, target,
  evaluation cadence and the trial's cap (keys: :class:`trainers.protocol.Plan`);
* **the clock**: it starts in ``start()``, after the script's setup; the time the worker takes
  to answer and the time checkpoints take are left out; a resumed run continues it;
* **stops**: after each step (``step_done``), every rank agrees whether to go on: the trial's
  cap, the deadline the worker gave with its last answer, the worker asking for a checkpoint,
  SIGTERM, a non-finite loss on any rank, or ``trial.stop(reason)``; ``report()`` sends an
  evaluation and takes the worker's answer (go on, stop, or save a checkpoint and go on), and
  ends the trial once the target metric reaches the target;
* **checkpoints**: ``save(folder)`` and ``load(folder)`` are called on every rank with the
  same new folder; the API adds its own state (clock, step, RNG states) beside the script's,
  decides when (SIGTERM, the worker's request, every ``checkpoint_every_s`` of the study),
  removes older folders once a new one is complete, and resumes from the one the plan names;
* **warm ranks**: ``trials()`` waits after a trial for the worker's next plan when the worker
  asks the ranks to serve, so the next trial starts in the same processes;
* **the process group**: ``start()`` opens ``torch.distributed``'s (gloo on CPUs, NCCL on
  GPUs) unless the script opened one already (``deepspeed.init_distributed`` or its own).

The API imports neither autotune, Optuna nor MLflow: a script needs only torch and this file's
package.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import math
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainers import _checkpoint, _shm, protocol
from trainers._control import CHECKPOINT, DIVERGED, GO, OOM, REASONS, STOPPED, Control
from trainers._lifeline import die_with_parent
from trainers._rank import Clock, next_plan
from trainers.reporter import Reporter, connect
from trainers.schedule import eval_interval, lr_at

__all__ = ["STOP_REASONS", "Trial", "trial", "trials"]

STOP_REASONS = {"diverged": DIVERGED, "oom": OOM, "stopped": STOPPED}
_SERVED = [0]                     # trials this process has begun (more than 1: warm ranks)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="an autotune trial")
    parser.add_argument("--plan", required=True, help="path of the resolved plan (JSON)")
    parser.add_argument("--report-to", default=None,
                        help="HOST:PORT of the worker's report channel (default: stdout)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=0,
                        help="set by the launcher")
    args, _ = parser.parse_known_args(argv)
    if os.environ.get("LOCAL_RANK") is not None:   # started by a launcher
        die_with_parent()        # the launcher gone (its worker killed): this rank goes too
    return args


def trials(argv: list[str] | None = None) -> Iterator[Trial]:
    """The trials this process runs: the one its plan names, then, while the worker asks the
    ranks to serve, each next plan it sends, until it says exit. A trial the script left
    without ending is ended here (``Trial.end``)."""
    args = _arguments(argv)
    plan: dict[str, Any] | None = json.loads(Path(args.plan).read_text())
    rank = int(os.environ.get("RANK", 0))
    reporter = connect(args.report_to) if rank == 0 else connect(None)
    try:
        while plan is not None:
            serves = bool(plan.get("serve")) and args.report_to is not None
            current = Trial(plan, reporter, serves=serves)
            yield current
            summary = current.end()
            if current.control.terminate:
                summary = {**summary, "reason": "checkpointed"}   # SIGTERM: leave
            del current          # the script's model and optimizer go before the next trial's
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            plan = next_plan(reporter, summary) if serves else None
    finally:
        reporter.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def trial(argv: list[str] | None = None) -> Trial:
    """The one trial of a script that runs one and exits (no warm ranks): the script calls
    ``end()`` itself."""
    args = _arguments(argv)
    plan = json.loads(Path(args.plan).read_text())
    rank = int(os.environ.get("RANK", 0))
    return Trial(plan, connect(args.report_to) if rank == 0 else connect(None))


def _close_gloo_group() -> None:
    """At exit, while the interpreter is whole: a gloo group left open to the interpreter's
    teardown can abort the process (``terminate called without an active exception``, exit
    -6) after the trial ended well. Closing it makes that rarer, not impossible (a script that
    must exit 0 leaves with ``os._exit`` as the bundled trainer does); the worker takes a trial
    whose end report arrived as ended whatever the exit code. NCCL groups are left alone:
    destroying one while a peer is gone can hang."""
    if dist.is_initialized() and dist.get_backend() == "gloo":
        dist.destroy_process_group()


def _open_process_group(device: str) -> None:
    if dist.is_initialized():
        return
    backend = "nccl" if device == "cuda" else "gloo"
    if backend == "gloo":
        atexit.register(_close_gloo_group)
    if "MASTER_ADDR" in os.environ:         # started by a launcher
        dist.init_process_group(backend)
        return
    with socket.socket() as s:              # run by hand: a world of one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)


def _number(key: str, value: Any) -> Any:
    """A reported metric as a plain number: a one-element tensor or a NumPy number (what
    ``correct / total`` gives in a training loop) is taken by its value; anything else that is
    not a number is refused in one line (it would not go into the report's JSON)."""
    if isinstance(value, bool) or value is None:
        return value
    if not isinstance(value, int | float) and callable(getattr(value, "item", None)):
        try:
            value = value.item()
        except (ValueError, RuntimeError):   # more than one element
            count = (value.numel() if callable(getattr(value, "numel", None))
                     else getattr(value, "size", "several"))
            raise ValueError(f"trial.report() got {key} with {count} values; report one "
                             "number (a mean, or .item() of one)") from None
    if isinstance(value, int | float):
        return value
    raise ValueError(f"trial.report() got {key}={value!r}, a {type(value).__name__}; report "
                     "numbers")


_SHM_CHECKED: list[bool] = []     # DeepSpeed's shared-memory op looked at, once a process


class Trial:
    """One trial on one rank (see the module docstring). ``plan`` is the resolved plan;
    ``state`` what a checkpoint carries besides the script's own (step, epoch, clock, best
    metrics); ``info`` and ``summary`` extra fields for the start and end reports."""

    def __init__(self, plan: dict[str, Any], reporter: Reporter, serves: bool = False) -> None:
        _SERVED[0] += 1
        self.plan, self.reporter, self.serves = plan, reporter, serves
        self.params: dict[str, Any] = dict(plan.get("params") or {})
        self.rank = int(os.environ.get("RANK", 0))
        self.world = int(os.environ.get("WORLD_SIZE", 1))
        self.on_gpu = plan.get("device") == "cuda"
        self.device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
                       if self.on_gpu else torch.device("cpu"))
        if not self.on_gpu and plan.get("threads_per_rank"):
            torch.set_num_threads(int(plan["threads_per_rank"]))
        if not self.on_gpu and not _SHM_CHECKED:   # before DeepSpeed opens a process group
            _SHM_CHECKED.append(True)
            note = _shm.leave_out_if_no_room()
            if note and self.rank == 0:
                print(f"autotune: {note}", file=sys.stderr, flush=True)
        torch.manual_seed(int(plan.get("seed", 0)))
        random.seed(int(plan.get("seed", 0)))
        self.wall0 = time.perf_counter()
        self.state: dict[str, Any] = {"epoch": 0, "step_in_epoch": 0, "step": 0, "evals": 0,
                                      "elapsed": 0.0, "train_s": 0.0, "eval_s": 0.0,
                                      "control_s": 0.0, "best": {}, "last_eval_at": 0.0,
                                      "deadline": -1.0}
        self.phases: dict[str, float] = {}
        self.control = Control(reporter, self.rank, self.state, float(plan["max_seconds"]))
        try:
            signal.signal(signal.SIGTERM, self.control.on_sigterm)
        except ValueError:      # not the main thread: the launcher's SIGTERM ends the process
            pass
        self.clock: Clock | None = None
        self.setup_s = 0.0
        self.reason, self.reached_at = "planned_epochs", None
        self.last_eval_cost = 0.0
        self._save: Callable[[Path], Any] | None = None
        self._load: Callable[[Path], Any] | None = None
        self._code, self._stop = GO, GO
        self._mark = self._due_at = 0.0
        self._samples, self._train_since = 0, 0.0
        self._saved: tuple[float, str] | None = None
        self._summary: dict[str, Any] | None = None

    # -- where the trial stands ---------------------------------------------------------------
    @property
    def step(self) -> int:
        """Optimizer steps done (a resumed trial starts where its checkpoint left off)."""
        return int(self.state["step"])

    @property
    def epoch(self) -> int:
        return int(self.state["epoch"])

    @property
    def step_in_epoch(self) -> int:
        """Steps done in the current epoch: where the data of a resumed epoch starts again."""
        return int(self.state["step_in_epoch"])

    @property
    def running(self) -> bool:
        """Whether to take another step: started, not stopped, steps left in the plan."""
        return (self.clock is not None and self._stop == GO and self.reason != "reached"
                and self.step < int(self.plan["total_steps"]))

    def elapsed(self) -> float:
        """Training seconds so far on this trial's clock (0 before ``start``)."""
        return self.clock.elapsed() if self.clock is not None else float(self.state["elapsed"])

    def lr(self, step: int | None = None) -> float:
        """The planned learning rate at ``step`` (default: the step about to be taken)."""
        return lr_at(self.step if step is None else int(step), float(self.plan["peak_lr"]),
                     self.plan["schedule"])

    # -- setup --------------------------------------------------------------------------------
    def note(self, phase: str) -> None:
        """Setup entered ``phase`` (rank 0 tells the worker, which names it if setup runs past
        its limit): for example ``data``, ``model``."""
        self.phases[phase] = time.perf_counter() - self.wall0
        if self.rank == 0:
            self.reporter.note({"type": "setup", "phase": phase, "at_s": self.phases[phase]})

    def checkpointing(self, save: Callable[[Path], Any], load: Callable[[Path], Any]) -> None:
        """How the script saves its state into a folder and loads it back (model, optimizer,
        scheduler: whatever it needs to go on). Both run on every rank with the same folder.
        Without them the trial cannot resume: a stop for a checkpoint ends it unsaved."""
        self._save, self._load = save, load

    def start(self, **info: Any) -> None:
        """Setup is done: opens the process group if the script has not, resumes from the
        plan's checkpoint, reports the start (``info``: extra fields) and starts the clock."""
        _open_process_group(str(self.plan.get("device", "cpu")))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.world != int(self.plan["world_size"]):
            raise SystemExit(f"the plan is for {self.plan['world_size']} ranks, but "
                             f"{self.world} started")
        resume = self.plan.get("resume_from")
        if resume:
            self.note("resume")
            self._resume(Path(resume))
        plan, st = self.plan, self.state
        self.clock = self.control.start({
            "setup_s": time.perf_counter() - self.wall0, "world_size": self.world,
            "hosts": [os.uname().nodename], "pid": os.getpid(), "served": _SERVED[0],
            "serves": self.serves, "setup_phases": self.phases,
            "resumed_at_s": st["elapsed"] if resume else None, **info})
        self.setup_s = time.perf_counter() - self.wall0
        self._auto = not int(plan["eval_every_steps"]) and not float(plan["eval_every_s"])
        self._mark = time.perf_counter()

    def _resume(self, folder: Path) -> None:
        if self._load is None:
            raise SystemExit(f"the plan resumes from {folder}, but the script gave no way to "
                             "load it: call trial.checkpointing(save=..., load=...) before "
                             "trial.start()")
        saved = _checkpoint.load_state(folder, self.rank, self.on_gpu)
        self._load(folder)
        self.state.update(saved)

    # -- training -----------------------------------------------------------------------------
    def stop(self, reason: str) -> None:
        """Ends the trial after this step, on every rank: ``diverged``, ``oom`` or ``stopped``
        (any rank may call it; the others learn it at ``step_done``)."""
        if reason not in STOP_REASONS:
            raise ValueError(f"unknown stop reason {reason!r}; use one of "
                             f"{', '.join(STOP_REASONS)}")
        self._code = max(self._code, STOP_REASONS[reason])

    def step_done(self, loss: float | torch.Tensor | None = None) -> bool:
        """One optimizer step is done (``loss``: its loss, checked for NaN or infinity).
        Every rank agrees whether the trial goes on; returns True when an evaluation is due
        (then call ``report``)."""
        if self.clock is None:
            raise RuntimeError("call trial.start() before the first step")
        st, plan = self.state, self.plan
        if loss is not None and not math.isfinite(float(loss)):
            self._code = max(self._code, DIVERGED)
        st["step"] += 1
        st["step_in_epoch"] += 1
        if st["step_in_epoch"] >= int(plan["steps_per_epoch"]):
            st["epoch"] += 1
            st["step_in_epoch"] = 0
        every_s = (eval_interval(plan["max_seconds"], self.last_eval_cost) if self._auto
                   else float(plan["eval_every_s"]))
        code, due = self.control.after_step(self._code, self.clock, every_s)
        self._code = GO
        now = time.perf_counter()
        st["train_s"] += now - self._mark
        self._train_since += now - self._mark
        self._samples += int(plan["global_batch"])
        self._mark = now
        if code != GO:
            self._stop = code
            if code == CHECKPOINT and self._save is not None:
                self._saved = self._save_checkpoint()
            return False
        every_steps = int(plan["steps_per_epoch"]) if self._auto else int(
            plan["eval_every_steps"])
        last = st["step"] >= int(plan["total_steps"])
        return bool(due or (every_steps and st["step"] % every_steps == 0) or last)

    def report(self, **metrics: Any) -> bool:
        """Reports an evaluation (``metrics``: the study's target metric, such as ``top1``,
        and any others, numbers) and follows the worker's answer; returns ``running``. The
        epoch, step, images seen, LR and images per second are added unless given."""
        if self.clock is None:
            raise RuntimeError("call trial.start() before reporting")
        metrics = {key: _number(key, value) for key, value in metrics.items()}
        st, plan = self.state, self.plan
        metric = str(plan["target"]["metric"])
        if metric not in metrics:
            raise ValueError(f"trial.report() needs the study's target metric {metric!r}; "
                             f"it got {', '.join(metrics) or 'nothing'}")
        value = metrics[metric]
        falling = protocol.falls(plan["target"])
        wrong = (protocol.metric_problem(float(value), falling)
                 if isinstance(value, int | float) and not isinstance(value, bool) else None)
        if wrong is not None:
            raise ValueError(f"trial.report() got {metric}={value:g}; {wrong}")
        cost = time.perf_counter() - self._mark
        self.last_eval_cost = cost
        st["eval_s"] += cost
        st["evals"] += 1
        for key, value in metrics.items():
            if isinstance(value, int | float) and math.isfinite(float(value)):
                # the best of a loss (or of a target metric that falls) is its least
                better = min if key == "loss" or (key == metric and falling) else max
                st["best"][key] = better(float(value), st["best"].get(key, float(value)))
        fields = {"index": st["evals"] - 1,
                  "epoch": st["step"] / int(plan["steps_per_epoch"]), "step": st["step"],
                  "samples": st["step"] * int(plan["global_batch"]),
                  "lr": self.lr(max(st["step"] - 1, 0)),
                  "images_per_s": self._samples / max(self._train_since, 1e-9), **metrics}
        value = float(metrics[metric])
        reached = protocol.reaches(value, float(plan["target"]["value"]), falling)
        action = self.control.report_eval(self.clock, fields, reached)
        self._samples, self._train_since = 0, 0.0
        if action == "reached":
            self.reason, self.reached_at = "reached", st["last_eval_at"]
        elif action == "stop":
            self._stop = STOPPED
        elif action == "checkpoint" and self._save is not None:
            self.control.checkpoint(self.clock, self._save_checkpoint, self._prune)
        self._mark = time.perf_counter()
        return self.running

    # -- checkpoints and the end --------------------------------------------------------------
    def _save_checkpoint(self) -> tuple[float, str]:
        """The script's state and the API's in a new ``step-N`` folder, on every rank; the
        elapsed seconds it holds and its folder."""
        assert self.clock is not None and self._save is not None
        st = self.state
        state = {**st, "elapsed": self.clock.elapsed(),
                 "control_s": st["control_s"] + self.clock.control_s}
        folder = Path(self.plan["checkpoint_dir"]) / _checkpoint.TAG.format(st["step"])
        folder.mkdir(parents=True, exist_ok=True)
        self._save(folder)
        _checkpoint.save_state(folder, state, self.rank, self.on_gpu)
        dist.barrier()
        return float(state["elapsed"]), str(folder)

    def _prune(self, keep: str) -> None:
        if self.rank == 0:
            _checkpoint.prune(Path(self.plan["checkpoint_dir"]), keep)

    def end(self, **extra: Any) -> dict[str, Any]:
        """Reports the trial's end (once; ``extra``: more fields for the end report) and
        returns the report. ``trials()`` calls it for a script that does not."""
        if self._summary is not None:
            return self._summary
        if self.clock is None:
            raise SystemExit("the script ended its trial without calling trial.start()")
        st = self.state
        reason = self.reason
        if self._stop != GO:
            reason = REASONS[self._stop]
        elif reason != "reached" and self.step < int(self.plan["total_steps"]):
            reason = "script_ended"            # the script left its loop on its own
        summary = {"type": "end", "reason": reason, "tta_s": self.reached_at,
                   "setup_s": self.setup_s, "train_s": st["train_s"], "eval_s": st["eval_s"],
                   "control_s": st["control_s"] + self.clock.control_s,
                   "elapsed_s": self.clock.elapsed(),
                   "wall_s": time.perf_counter() - self.wall0, "steps": st["step"],
                   "evals": st["evals"], "micro_batch": self.plan.get("micro_batch"),
                   **{f"best_{k}": v for k, v in st["best"].items()}, **extra}
        if self._saved is not None:
            summary["checkpoint_elapsed_s"], summary["checkpoint"] = self._saved
        model = self.plan.get("model_path")
        if reason == "reached" and model and "model_path" not in summary \
                and Path(model).is_file():      # a script saved its model where the plan said
            summary["model_path"] = str(model)
        self.control.end(summary, self._prune)
        self._summary = summary
        return summary
