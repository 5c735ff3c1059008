"""The trial runner: one trial, start to end: sample, plan, launch, follow its reports, record
its outcome.

The decisions (what a report records, go on or stop, the outcome and how it is told to Optuna)
are ``autotune.decisions``, which the replay (``autotune.replay``) calls too; this module holds
their side effects: processes, the report channel, the study store's availability, MLflow.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from trainers import protocol

from . import record
from ._ops import ensure_cpu_ops
from ._preflight import probe_micro_batch
from ._reports import HeldWrites, ReportHandler, setup_whereabouts
from ._retry import StoreUnavailable
from .config import StudyConfig
from .decisions import (
    CONFIG_FAILURES,
    CONSTRAINT,
    TrialResult,
    classify,
    eval_reply,
    optuna_state,
    study_deadline,
    tell,
    tell_optuna_style,
    tell_result,
)
from .errors import AutotuneError, PlanError, SpaceError
from .launch import (
    ReportChannel,
    TrainerProcess,
    WarmRanks,
    deepspeed_command,
    free_port,
    multinode_commands,
    read_hostfile,
    trainer_env,
    trainer_path,
)
from .plan import Hardware, derived_params, resolve
from .pruners import TimeToAccuracyPruner
from .samplers import ExploringTPESampler
from .space import InfeasiblePoint, SearchSpace
from .tracking import Tracker

log = logging.getLogger("autotune")

__all__ = ["CONFIG_FAILURES", "CONSTRAINT", "TrialResult", "TrialRunner", "make_pruner",
           "make_sampler", "optuna_state", "tell_optuna_style", "tell_result"]

MAX_INFEASIBLE = 100        # constraint-violating samples in a row before giving up
# Warm trainer ranks are replaced after this many trials: whatever a long-lived process
# accumulates (allocator fragmentation, a library's caches) stays bounded.
WARM_TRIALS_MAX = 100


def make_pruner(cfg: StudyConfig) -> optuna.pruners.BasePruner:
    """The study's pruner, from its config: autotune's, or Optuna's median rule or none (both
    with Optuna's own conventions, for comparisons)."""
    if cfg.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)
    if cfg.pruner == "none":
        return optuna.pruners.NopPruner()
    return TimeToAccuracyPruner(cfg.target.value, metric=cfg.target.metric,
                                num_classes=cfg.trainer.num_classes, margin=cfg.pruner_margin)


def make_sampler(cfg: StudyConfig, seed: int | None) -> optuna.samplers.BaseSampler:
    """autotune's sampler; plain TPE in the comparison modes (``pruner`` median or none).
    ``seed`` seeds this process's draws (a worker passes None and draws its own: its spread
    points keep away from every other worker's trials through the study store)."""
    if cfg.pruner == "tta":
        return ExploringTPESampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)


class TrialRunner:
    """Runs trials of one study; shared by the local workers."""

    def __init__(self, cfg: StudyConfig, space: SearchSpace, train_size: int,
                 tracker: Tracker | None, run_dir: Path, stop_at: float | None,
                 storage: Any = None, session: Any = None, hostfile: Path | None = None,
                 ranks_per_node: int | None = None) -> None:
        self.storage = storage
        # Trials across the nodes of a DeepSpeed hostfile (launched over ssh with pdsh from
        # this machine), or on this machine's ranks.
        self.hostfile = hostfile
        self.ranks_per_node = ranks_per_node
        world = cfg.ranks_per_trial
        if hostfile is not None:
            hosts = read_hostfile(hostfile)
            world = (len(hosts) * ranks_per_node if ranks_per_node
                     else sum(slots for _, slots in hosts))
        self.session = session      # a control.WorkerSession: attempts and heartbeats
        self._interrupted = threading.Event()
        self._local = threading.local()   # each local worker thread's warm ranks
        self._ops_lock, self._ops_ready = threading.Lock(), False
        self.cfg = cfg
        self.space = space
        self.train_size = train_size
        self.tracker = tracker
        self.run_dir = run_dir
        self.stop_at = stop_at
        self.pruner = make_pruner(cfg)
        cap = cfg.trainer.max_micro_batch
        if cfg.trainer.probe_micro_batch:
            cap = probe_micro_batch(cfg, ranks_per_node or cfg.ranks_per_trial)
        self.hardware = Hardware(world_size=world, device=cfg.device, max_micro_batch=cap)

    def _ask(self, study: optuna.Study) -> tuple[optuna.Trial, dict[str, Any]]:
        """A new trial and its parameters; points that violate a constraint are dropped
        (recorded as failed with outcome ``infeasible``, never trained nor counted)."""
        for _ in range(MAX_INFEASIBLE):
            trial = study.ask()
            try:
                params = self.space.sample(trial)
            except InfeasiblePoint as e:
                trial.set_user_attr(record.OUTCOME, "infeasible")
                trial.set_user_attr(record.DETAIL, str(e))
                study.tell(trial, state=TrialState.FAIL)
                continue
            trial.set_user_attr(record.PARAMS, params)
            if trial.user_attrs.get(record.CURVE):  # a retry of a lost trial starts afresh
                trial.set_user_attr(record.CURVE, [])
            return trial, params
        raise SpaceError(f"{MAX_INFEASIBLE} sampled points in a row violate the search space's "
                         "constraints; loosen them or narrow the ranges they depend on")

    def close(self) -> None:
        """Lets the calling worker thread's warm trainer ranks leave (see ``WarmRanks``)."""
        ranks = getattr(self._local, "ranks", None)
        self._local.ranks = None
        if ranks is not None:
            ranks.close()

    def __enter__(self) -> TrialRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def interrupt(self) -> None:
        """Asks the running trial to checkpoint and stop; it is queued to resume elsewhere."""
        self._interrupted.set()

    @contextlib.contextmanager
    def _patience(self, seconds: float | None) -> Iterator[None]:
        """Within the block, an unreachable study store raises StoreUnavailable after
        ``seconds`` (None: the store's own patience, which rides out a restart)."""
        patience = getattr(self.storage, "patience", None)
        if patience is None or seconds is None:
            yield
        else:
            with patience(seconds):
                yield

    def _record(self, trial: optuna.Trial, attempt: int, **fields: Any) -> None:
        if self.session is not None:
            self.session.attempt(trial.number, attempt, **fields)

    def run(self, study: optuna.Study) -> TrialResult:
        trial, params = self._ask(study)
        attrs = trial.user_attrs
        lineage = list(attrs.get(record.LINEAGE, []))
        attempt = len(lineage) + 1
        downtime = None
        if lineage and attrs.get(record.INTERRUPTED_AT) is not None:
            downtime = max(time.time() - float(attrs[record.INTERRUPTED_AT]), 0.0)
            trial.set_user_attr(record.DOWNTIME, downtime)
        self._record(trial, attempt, status="running", downtime_s=downtime,
                     resume_of=lineage[-1] if lineage else None,
                     mlflow_run_id=f"trial-{trial.number}" if self.tracker else None)
        if self.tracker and attrs.get(record.LOST_RUN_KEY):
            self.tracker.lost_trial(str(attrs[record.LOST_RUN_KEY]),
                                    str(attrs.get(record.LOST_WORKER)),
                                    self.run_dir)
        try:
            result = self._run(study, trial, params)
        except BaseException:
            self._record(trial, attempt, status="finished")
            with contextlib.suppress(Exception):
                study.tell(trial, state=TrialState.FAIL)
            raise
        told = self._tell_once(study, trial, result)
        status = "interrupted" if result.reason == "interrupted" else "finished"
        self._record(trial, attempt, status=status if told else "abandoned",
                     elapsed_s=result.summary.get("elapsed_s"),
                     mlflow_run_id=self.tracker.known_run_id(f"trial-{trial.number}")
                     if self.tracker else None)
        if told and result.reason == "interrupted" and result.summary.get("checkpoint"):
            self._queue_resumption(study, trial, params, result)
        if self.tracker:
            self.tracker.study_plots(study, self.cfg.target.metric, self.cfg.target.value)
        return result

    def _tell_once(self, study: optuna.Study, trial: optuna.Trial, result: TrialResult) -> bool:
        """Tells ``result``; False when the trial was already ended elsewhere (its worker was
        given up for lost while the study store was out of reach, and it was resumed)."""
        try:
            self._tell(study, trial, result)
            return True
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError) as e:
            state = record.stored_trial(study, trial).state
            if state == TrialState.RUNNING:
                raise
            log.warning("trial %d had already ended (%s) when its result came: %s",
                        trial.number, state.name, e)
            result.detail = f"given up while this worker was out of reach: {result.detail}"
            return False

    def _queue_resumption(self, study: optuna.Study, trial: optuna.Trial,
                          params: dict[str, Any], result: TrialResult) -> None:
        """The same configuration, queued to continue from its checkpoint on any worker."""
        attrs = trial.user_attrs if hasattr(trial, "user_attrs") else {}
        study.enqueue_trial(dict(trial.params), user_attrs=record.resumption(
            attrs.get(record.LINEAGE, []), trial.number, result.summary["checkpoint"],
            result.summary.get("checkpoint_elapsed_s"), time.time()))

    def _plan(self, trial: optuna.Trial, params: dict[str, Any]) -> dict[str, Any]:
        trainer = {**self.cfg.trainer.__dict__}
        plan = resolve(params, trainer=trainer, train_size=self.train_size,
                       hardware=self.hardware, target=self.cfg.target.__dict__,
                       max_seconds=self.cfg.budget.max_trial_s,
                       seed=self.cfg.seed + trial.number)
        return plan

    def _run(self, study: optuna.Study, trial: optuna.Trial,
             params: dict[str, Any]) -> TrialResult:
        try:
            plan = self._plan(trial, params)
        except PlanError as e:
            return TrialResult(trial.number, params, "failed", "plan_error", detail=str(e))
        folder = self.run_dir / f"trial-{trial.number}"
        folder.mkdir(parents=True, exist_ok=True)
        plan["checkpoint_dir"] = str((folder / "checkpoint").resolve())
        resume = trial.user_attrs.get(record.RESUME_FROM)
        if resume:  # a resumption: same parameters, its clock continues from the checkpoint
            plan["resume_from"] = resume
        plan_path = folder / "plan.json"
        plan_path.write_text(json.dumps(plan, indent=2))
        derived = derived_params(plan)
        for key, value in derived.items():
            trial.set_user_attr(f"plan.{key}", value)
        run_key = None
        if self.tracker:
            lineage = list(trial.user_attrs.get(record.LINEAGE, []))
            run_key = self.tracker.start_trial(
                trial.number, params, derived, plan, attempt=len(lineage) + 1,
                tags={"autotune.resume_of": str(lineage[-1])} if lineage else None)
            trial.set_user_attr(record.RUN_KEY, run_key)
        result = self._follow(study, trial, plan, plan_path, folder, run_key)
        result.params = params
        if self.tracker and run_key:
            state = optuna_state(result)
            final = {"reached_target": 1.0 if result.outcome == "reached" else 0.0,
                     "best_" + self.cfg.target.metric: result.best_metric}
            if result.outcome == "reached":
                final["tta_s"] = float(result.value or 0.0)
            for key in ("setup_s", "train_s", "eval_s", "control_s", "wall_s"):
                if key in result.summary:
                    final[key] = result.summary[key]
            if "elapsed_s" in result.summary:  # the per-evaluation series keeps its own name
                final["total_elapsed_s"] = result.summary["elapsed_s"]
            self.tracker.end_trial(run_key, state=state, outcome=result.outcome,
                                   reason=result.reason, metrics=final, curve=result.curve,
                                   metric=self.cfg.target.metric, target=self.cfg.target.value,
                                   detail=result.detail)
        return result

    def _start(self, trial: optuna.Trial, plan: dict[str, Any], plan_path: Path,
               folder: Path) -> tuple[ReportChannel, TrainerProcess, WarmRanks | None]:
        """The trial's trainer: this worker's warm ranks, given the plan, or a new launch
        (which serves later trials too, with ``trainer.warm_ranks``)."""
        ranks: WarmRanks | None = getattr(self._local, "ranks", None)
        self._local.ranks = None
        log_file = folder / "trainer.log"
        if ranks is not None:
            if ranks.hand(plan):
                log_file.write_text(f"# warm ranks started for trial {ranks.started_for}, "
                                    f"their trial {ranks.trials}; their whole log: "
                                    f"{ranks.process.log_path}\n")
                (folder / "command.txt").write_text(f"# warm ranks started for trial "
                                                    f"{ranks.started_for}\n")
                return ranks.channel, ranks.process, ranks
            log.info("the warm trainer ranks of trial %d are gone (exit code %s); trial %d "
                     "launches anew", ranks.started_for, ranks.process.proc.poll(),
                     trial.number)
            ranks.close(kill=True)
        if self.cfg.device == "cpu" and self.hostfile is None:
            with self._ops_lock:   # once per worker: the op DeepSpeed's CPU ranks compile
                if not self._ops_ready:
                    ensure_cpu_ops(trainer_env(self.cfg.device, 1),
                                   echo=lambda line: print(f"autotune: {line}", flush=True))
                    self._ops_ready = True
        channel, command = self._command(plan_path)
        serve = self.cfg.trainer.warm_ranks
        if serve:
            command.append("--serve")
            log_file = self.run_dir / "ranks" / f"from-trial-{trial.number}.log"
            log_file.parent.mkdir(parents=True, exist_ok=True)
            (folder / "trainer.log").write_text(f"# trainer ranks started for this trial; "
                                                f"their whole log: {log_file}\n")
        (folder / "command.txt").write_text(" ".join(command) + "\n")
        try:
            process = TrainerProcess(command, trainer_env(self.cfg.device, 1), log_file)
        except AutotuneError:
            channel.close()
            raise
        return channel, process, WarmRanks(channel, process, trial.number) if serve else None

    def _follow(self, study: optuna.Study, trial: optuna.Trial, plan: dict[str, Any],
                plan_path: Path, folder: Path, run_key: str | None) -> TrialResult:
        try:
            channel, process, ranks = self._start(trial, plan, plan_path, folder)
        except AutotuneError as e:
            return TrialResult(trial.number, {}, "failed", "launch_error", detail=str(e))
        launched_at = time.monotonic()
        channel.setup_note = None     # warm ranks: the last trial's notes are not this one's
        end: dict[str, Any] | None = None
        # Setup has its own limit, counted from the launch; training's starts at the start
        # report (the first step), so a slow setup never eats a trial's training time.
        setup_limit = float(self.cfg.trainer.setup_limit_s)
        limits = {"until": time.monotonic() + setup_limit, "phase": "setup"}
        training_limit = plan["max_seconds"] * 2 + 60
        asked: list[bool] = []
        writes = HeldWrites(self._patience, trial.number)
        handler = ReportHandler(
            trial, writes, metric=self.cfg.target.metric, planned_epochs=plan["epochs"],
            checkpoint_every_s=self.cfg.trainer.checkpoint_every_s,
            deadline=partial(self._deadline, study),
            decide=lambda msg, last: self._decide(study, trial, msg, last),
            cap=self._within_timeout, listeners=self._listeners(trial, run_key))

        def idle() -> None:
            if self._interrupted.is_set() and not asked:
                channel.request("checkpoint")
                asked.append(True)

        try:
            for msg in channel.messages(process, lambda: limits["until"], idle):
                if msg.get("type") == "end":
                    end = msg
                    channel.reply(protocol.ACK)
                    break     # warm ranks now wait for the next plan; others exit
                if msg.get("type") == "start":
                    limits.update(until=time.monotonic() + training_limit, phase="training")
                reply = handler.answer(msg)
                if reply is not None:
                    channel.reply(reply)
        finally:
            code = self._finish(channel, process, ranks, end, folder,
                                keep=not self._interrupted.is_set() and not writes.given_up
                                and handler.serves)
            writes.flush(None)
        stop_reason = handler.stop_reason
        if (end is not None and end.get("reason") == "bound" and self.stop_at is not None
                and time.monotonic() >= self.stop_at - 1.0):
            end = {**end, "reason": "stopped"}       # it was the study's deadline, not the best
            stop_reason = "study_timeout"
        result = classify(trial.number, end, code, process.tail() if end is None else "",
                          handler.best, handler.evals, stop_reason)
        if end is None and time.monotonic() > limits["until"]:   # killed at its limit: say so
            if limits["phase"] == "setup":
                result.reason = "setup_timeout"
                result.detail = (f"the trainer did not finish setting up within {setup_limit:.0f}"
                                 f" s of its launch (trainer.setup_limit_s); "
                                 f"{setup_whereabouts(channel, launched_at)}; raise the limit "
                                 f"where a first setup is slow. {result.detail}")
            else:
                result.detail = (f"no report for {training_limit:.0f} s of training (2 x "
                                 f"max_trial_s + 60 s): stopped as hung. {result.detail}")
        if result.reason == "crashed" and "unrecognized arguments: --serve" in result.detail:
            result.detail = (f"trainer program {self.cfg.trainer.program!r} does not take "
                             "--serve (warm ranks); set trainer.warm_ranks: false in the "
                             "study file, or make it serve plans as trainers/image_classifier "
                             "does")
        result.curve = handler.curve
        return result

    def _listeners(self, trial: optuna.Trial, run_key: str | None
                   ) -> tuple[Callable[[str, dict[str, Any]], None], ...]:
        """Who hears of a trial's reports besides the study store: its MLflow run (start and
        evaluations) and the worker registry (checkpoints, so a resumption finds the latest)."""
        attempt = len(trial.user_attrs.get(record.LINEAGE, [])) + 1

        def registry(kind: str, msg: dict[str, Any]) -> None:
            if kind == "checkpoint":
                self._record(trial, attempt, checkpoint_path=str(msg["path"]),
                             elapsed_s=float(msg["elapsed_s"]))

        def mlflow(kind: str, msg: dict[str, Any]) -> None:
            if self.tracker is None or not run_key:
                return
            if kind == "start":
                self.tracker.log_start(run_key, msg)
            elif kind == "eval":
                self.tracker.log_eval(run_key, msg)

        return (mlflow, registry)

    def _within_timeout(self, reply: dict[str, Any], elapsed: float) -> dict[str, Any]:
        """``reply`` with its deadline no later than the study's ``timeout_s``: the trainer
        stops on its own there, between evaluations, not at its next one."""
        if self.stop_at is None:
            return reply
        cap = max(elapsed + self.stop_at - time.monotonic(), 1e-3)
        deadline = reply.get("deadline_s")
        return {**reply, "deadline_s": cap if deadline is None else min(float(deadline), cap)}

    def _finish(self, channel: ReportChannel, process: TrainerProcess,
                ranks: WarmRanks | None, end: dict[str, Any] | None, folder: Path,
                keep: bool) -> int:
        """After a trial: warm ranks that ended it well are kept for this worker's next trial;
        other trainers are stopped. Returns the exit code (0 for kept ranks)."""
        if ranks is None:
            channel.close()
            if end is None:
                process.kill()
            return process.wait(ended=end is not None)
        ranks.copy_log(folder / "trainer.log")
        if keep and end is not None and not protocol.leaves_after(end.get("reason")) \
                and ranks.trials < WARM_TRIALS_MAX:
            self._local.ranks = ranks
            return 0
        return ranks.close(kill=end is None)

    def _command(self, plan_path: Path) -> tuple[ReportChannel, list[str]]:
        """The report channel and the launcher command of a trial."""
        script = trainer_path(self.cfg.trainer.program)
        if self.hostfile is None:
            channel = ReportChannel()
            return channel, deepspeed_command(script, plan_path, channel.address,
                                              ranks=self.cfg.ranks_per_trial,
                                              master_port=free_port())
        channel = ReportChannel("0.0.0.0", advertise=socket.getfqdn())
        first = read_hostfile(self.hostfile)[0][0]
        command = multinode_commands(script, plan_path, channel.address,
                                     hostfile=self.hostfile, master_addr=first,
                                     master_port=free_port(), ssh=True)[0]
        if self.ranks_per_node:
            command[1:1] = ["--num_gpus", str(self.ranks_per_node)]
        return channel, command

    def _deadline(self, study: optuna.Study, last: float | None) -> float | None:
        """The pruner's deadline for a trial; ``last`` when the study store is away."""
        try:
            with self._patience(0):
                return study_deadline(self.pruner, study)
        except StoreUnavailable:
            return last

    def _decide(self, study: optuna.Study, trial: optuna.Trial, msg: dict[str, Any],
                last_deadline: float | None) -> dict[str, Any]:
        """``decisions.eval_reply``; go on, with the last deadline, while the store is away."""
        try:
            with self._patience(0):
                return eval_reply(self.pruner, study, trial, msg, now=time.monotonic(),
                                  stop_at=self.stop_at)
        except StoreUnavailable:
            return protocol.go(last_deadline)

    def _tell(self, study: optuna.Study, trial: optuna.Trial, result: TrialResult) -> None:
        tell(study, trial, result, autotune=self.cfg.pruner == "tta",
             target=self.cfg.target.value, penalty=2 * self.cfg.budget.max_trial_s)

