"""The trial runner: one trial, start to end: sample, plan, start its trainer, answer its
reports, record its outcome.

What it decides is elsewhere, in pieces the replay (``autotune.replay``) calls too: what each
report records and the answer to it (``_reports.ReportHandler`` over ``decisions``), the
outcome and how it is told to Optuna (``decisions``). Its trainer's ranks, warm or fresh, are
``ranks.Ranks``; MLflow and the worker registry hear of each trial as listeners
(``trial_events``). What remains here is the order of things and the study store's moods.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from trainers import protocol

from . import record
from ._ops import ensure_cpu_ops
from ._preflight import probe_micro_batch
from ._reports import HeldWrites, Limits, Pruning, ReportHandler
from .config import StudyConfig
from .control import worker_name
from .decisions import TrialResult, classify, tell
from .errors import AutotuneError, PlanError, SpaceError, is_disk_full
from .launch import read_hostfile, trainer_env
from .modes import make_pruner, mode_of
from .plan import Hardware, derived_params, resolve
from .pruners import TimeToAccuracyPruner
from .ranks import Ranks, trial_command
from .space import InfeasiblePoint, SearchSpace, SpaceCodeError
from .stopping import describe, stop_requested
from .trial_events import MlflowListener, RegistryListener, TrialListener

log = logging.getLogger("autotune")

__all__ = ["TrialRunner"]

MAX_INFEASIBLE = 100        # constraint-violating samples in a row before giving up
MAX_RAISED = 3              # samples in a row the space's own code raised on before giving up
MODEL_FILE = "model.pt"     # in a trial's folder: its model, saved once it reached the target
STOP_CHECK_S = 2.0          # how often a running trial's worker looks for `stop study --now`


class TrialRunner:
    """Runs trials of one study; shared by the local workers (each thread its own ranks)."""

    def __init__(self, cfg: StudyConfig, space: SearchSpace, train_size: int, *,
                 run_dir: Path, tracker: Any = None, stop_at: float | None = None,
                 storage: Any = None, session: Any = None, hostfile: Path | None = None,
                 ranks_per_node: int | None = None) -> None:
        """``tracker``: MLflow's (None: not recorded there); ``stop_at``: the study's end
        (``time.monotonic()``); ``storage``: the study store (its patience is used when it is
        away); ``session``: the worker registry's; ``hostfile``/``ranks_per_node``: trials
        across the nodes of a DeepSpeed hostfile (launched over ssh from this machine)."""
        self.cfg, self.space, self.train_size = cfg, space, train_size
        self.run_dir, self.stop_at, self.storage = run_dir, stop_at, storage
        self.asker = str(getattr(session, "name", "") or worker_name())
        self.hostfile, self.ranks_per_node = hostfile, ranks_per_node
        world = cfg.ranks_per_trial
        if hostfile is not None:
            hosts = read_hostfile(hostfile)
            world = (len(hosts) * ranks_per_node if ranks_per_node
                     else sum(slots for _, slots in hosts))
        mlflow = (MlflowListener(tracker, run_dir, cfg.target.metric, cfg.target.value,
                                  cfg.target.falls)
                  if tracker is not None else None)
        self.listeners: list[TrialListener] = [
            *([mlflow] if mlflow else []),
            *([RegistryListener(session, mlflow)] if session is not None else [])]
        self._interrupted = threading.Event()
        self._stop_checked = 0.0          # when `stop study --now` was last looked for
        self._local = threading.local()   # each local worker thread's ranks
        self._ops_lock, self._ops_ready = threading.Lock(), False
        self.pruner = make_pruner(cfg)
        cap = cfg.trainer.max_micro_batch
        if cfg.trainer.probe_micro_batch:
            cap = probe_micro_batch(cfg, ranks_per_node or cfg.ranks_per_trial)
        self.hardware = Hardware(world_size=world, device=cfg.device, max_micro_batch=cap)

    def _emit(self, event: str, *args: Any) -> None:
        for listener in self.listeners:
            getattr(listener, event)(*args)

    @property
    def ranks(self) -> Ranks:
        """The calling worker thread's trainer ranks."""
        ranks = getattr(self._local, "ranks", None)
        if ranks is None:
            ranks = self._local.ranks = Ranks(
                trial_command(self.cfg.trainer.program, self.cfg.ranks_per_trial,
                              self.hostfile, self.ranks_per_node),
                trainer_env(self.cfg.device, 1, program=self.cfg.trainer.program),
                serve=self.cfg.trainer.warm_ranks,
                log_dir=self.run_dir / "ranks", before_launch=self._build_ops)
        return ranks

    def _build_ops(self) -> None:
        """Once per worker, before its first launch: the op DeepSpeed's CPU ranks compile."""
        if self.cfg.device != "cpu" or self.hostfile is not None:
            return
        with self._ops_lock:
            if not self._ops_ready:
                ensure_cpu_ops(trainer_env(self.cfg.device, 1),
                               echo=lambda line: print(f"autotune: {line}", flush=True))
                self._ops_ready = True

    def close(self) -> None:
        """Lets the calling worker thread's warm trainer ranks leave."""
        ranks, self._local.ranks = getattr(self._local, "ranks", None), None
        if ranks is not None:
            ranks.close()

    def __enter__(self) -> TrialRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def interrupt(self) -> None:
        """Asks the running trial to checkpoint and stop; it is queued to resume elsewhere."""
        self._interrupted.set()

    def _check_stop_now(self, study: optuna.Study) -> None:
        """Every ``STOP_CHECK_S`` while a trial runs: `autotune stop study --now` interrupts it
        as SIGTERM would (a store that is away is asked again next time)."""
        now = time.monotonic()
        if self._interrupted.is_set() or now < self._stop_checked + STOP_CHECK_S:
            return
        self._stop_checked = now
        try:
            with self._patience(0):
                request = stop_requested(study)
        except Exception:  # noqa: BLE001 - the store is away: the trial goes on meanwhile
            return
        if request is not None and request.get("now"):
            log.info("the study was %s: trial checkpoints and stops", describe(request))
            self.interrupt()

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

    def _ask_marked(self, study: optuna.Study) -> optuna.Trial:
        """Optuna's next trial, marked as this worker's (``ASKED_BY``: autotune's, not a
        notebook's). A new trial holds the mark from the write that creates it, so a worker
        killed while asking leaves a trial the sweep knows for autotune's; a queued one popped
        from the waiting list gets it right after."""
        marks = {record.ASKED_BY: self.asker}
        hold = getattr(self.storage, "new_trials_hold", None)
        with hold(marks) if hold is not None else contextlib.nullcontext():
            trial = study.ask()
        if trial.user_attrs.get(record.ASKED_BY) != self.asker:
            trial.set_user_attr(record.ASKED_BY, self.asker)
        return trial

    def _ask(self, study: optuna.Study) -> tuple[optuna.Trial, dict[str, Any]]:
        """A new trial and its parameters; points that violate a constraint, or that the
        space's define-by-run code raised on, are dropped (recorded as failed with outcome
        ``infeasible`` and why, never trained nor counted)."""
        raised = 0
        for _ in range(MAX_INFEASIBLE):
            trial = self._ask_marked(study)
            try:
                params = self.space.sample(trial)
            except (InfeasiblePoint, SpaceCodeError) as e:
                # dropped, never trained nor counted; the space's own (define-by-run) code
                # raising at each of MAX_RAISED points in a row is broken, not unlucky
                code = isinstance(e, SpaceCodeError)
                why = f"the search space's {e}" if code else str(e)
                trial.set_user_attr(record.OUTCOME, "infeasible")
                trial.set_user_attr(record.DETAIL, why[:1000])
                study.tell(trial, state=TrialState.FAIL)
                if getattr(e, "constraint", "") == "enqueued":   # a user's own: say so
                    print(f"autotune: trial {trial.number} dropped: {e}", flush=True)
                raised = raised + 1 if code else 0
                if raised >= MAX_RAISED:
                    raise SpaceError(f"{why} ({raised} points in a row); fix it and check "
                                     "the space with `autotune space check FILE`") from None
                continue
            trial.set_user_attr(record.PARAMS, params)
            if trial.user_attrs.get(record.CURVE):  # a retry of a lost trial starts afresh
                trial.set_user_attr(record.CURVE, [])
            return trial, params
        raise SpaceError(f"{MAX_INFEASIBLE} sampled points in a row violate the search space's "
                         "constraints; loosen them or narrow the ranges they depend on")

    def run(self, study: optuna.Study) -> TrialResult:
        """Runs the study's next trial to its end and records it."""
        trial, params = self._ask(study)
        attrs, downtime = trial.user_attrs, None
        if attrs.get(record.LINEAGE) and attrs.get(record.INTERRUPTED_AT) is not None:
            downtime = max(time.time() - float(attrs[record.INTERRUPTED_AT]), 0.0)
            trial.set_user_attr(record.DOWNTIME, downtime)
        self._emit("begun", trial, downtime)
        try:
            result = self._run(study, trial, params)
        except BaseException as e:
            if is_disk_full(e):
                # no fault of the configuration: left running, the trial is taken for its
                # lost worker's once this process has gone and resumed from its checkpoint
                raise
            with contextlib.suppress(Exception):
                self._emit("aborted", trial)
            with contextlib.suppress(Exception):   # autotune's own end, not another client's
                trial.set_user_attr(record.OUTCOME, "failed")
                trial.set_user_attr(record.STOP_REASON, "aborted")
                trial.set_user_attr(record.DETAIL, f"the worker stopped with the trial "
                                    f"unfinished ({type(e).__name__})")
            with contextlib.suppress(Exception):
                study.tell(trial, state=TrialState.FAIL)
            if isinstance(e, KeyboardInterrupt):
                e.failed_trial = trial.number  # type: ignore[attr-defined] # for the CLI's line
            raise
        try:
            self._emit("ended", trial, result)
        finally:   # the trial's record in MLflow failing (a full disk) leaves the result told
            told = self._tell_once(study, trial, result)
        self._emit("told", trial, result, told)
        if told and result.reason == "interrupted" and result.summary.get("checkpoint"):
            study.enqueue_trial(dict(trial.params), user_attrs=record.resumption(
                attrs.get(record.LINEAGE, []), trial.number, result.summary["checkpoint"],
                result.summary.get("checkpoint_elapsed_s"), time.time()))
        if told:
            self._remove_stale_models(study)
        self._emit("study_changed", study)
        return result

    def _remove_stale_models(self, study: optuna.Study) -> None:
        """Removes the models of this worker's trials that a faster trial's model replaced
        (``record.stale_models``); only files under this study's run folder."""
        mine = self.run_dir.resolve()
        for path in record.stale_models(study.get_trials(deepcopy=False,
                                                         states=(TrialState.COMPLETE,))):
            file = Path(path)
            if mine in file.parents and file.is_file():
                with contextlib.suppress(OSError):
                    file.unlink()
                    log.info("removed %s: a faster trial saved its model", file)

    def _tell_once(self, study: optuna.Study, trial: optuna.Trial, result: TrialResult) -> bool:
        """Tells ``result``; False when the trial was already ended elsewhere (its worker was
        given up for lost while the study store was out of reach, and it was resumed)."""
        try:
            tell(study, trial, result, autotune=mode_of(self.cfg).tells_constraints,
                 target=self.cfg.target.value, penalty=2 * self.cfg.budget.max_trial_s,
                 falls=self.cfg.target.falls)
            return True
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError) as e:
            state = record.stored_trial(study, trial).state
            if state == TrialState.RUNNING:
                raise
            stored = record.stored_trial(study, trial)
            log.warning("trial %d had already ended (%s) when its result came: %s",
                        trial.number, state.name, e)
            result.detail = ("given up while this worker was out of reach"
                             if record.ended_by(stored) == "worker_lost" else
                             f"ended by another Optuna client ({state.name}) while it trained"
                             ) + (f": {result.detail}" if result.detail else "")
            return False

    def _run(self, study: optuna.Study, trial: optuna.Trial,
             params: dict[str, Any]) -> TrialResult:
        try:
            plan = resolve(params, trainer={**self.cfg.trainer.__dict__},
                           train_size=self.train_size, hardware=self.hardware,
                           target=self.cfg.target.__dict__,
                           max_seconds=self.cfg.budget.max_trial_s,
                           seed=self.cfg.seed + trial.number)
        except PlanError as e:
            return TrialResult(trial.number, params, "failed", "plan_error", detail=str(e))
        folder = self.run_dir / f"trial-{trial.number}"
        folder.mkdir(parents=True, exist_ok=True)
        plan["checkpoint_dir"] = str((folder / "checkpoint").resolve())
        if self.cfg.trainer.save_model:
            plan["model_path"] = str((folder / MODEL_FILE).resolve())
        resume = trial.user_attrs.get(record.RESUME_FROM)
        if resume:  # a resumption: same parameters, its clock continues from the checkpoint
            plan["resume_from"] = resume
        derived = derived_params(plan)
        for key, value in derived.items():
            trial.set_user_attr(f"plan.{key}", value)
        self._emit("planned", trial, params, derived, plan)
        result = self._follow(study, trial, plan, folder)
        result.params = params
        return result

    def _follow(self, study: optuna.Study, trial: optuna.Trial, plan: dict[str, Any],
                folder: Path) -> TrialResult:
        """Starts the trial's trainer and answers its reports until its end."""
        try:
            launched = self.ranks.start(trial.number, plan, folder)
        except AutotuneError as e:
            return TrialResult(trial.number, {}, "failed", "launch_error", detail=str(e))
        channel, process = launched.channel, launched.process
        launched_at = time.monotonic()
        channel.setup_note = None     # warm ranks: the last trial's notes are not this one's
        end: dict[str, Any] | None = None
        # Setup has its own limit, counted from the launch; training's starts at the start
        # report (the first step), so a slow setup never eats a trial's training time.
        limits = Limits(float(self.cfg.trainer.setup_limit_s), plan["max_seconds"] * 2 + 60)
        asked: list[bool] = []
        writes = HeldWrites(self._patience, trial.number, ended_by=lambda: record.ended_by(
            record.stored_trial(study, trial)))
        pruning = Pruning(self.pruner, study, trial, self._patience, self.stop_at)
        handler = ReportHandler(
            trial, writes, metric=self.cfg.target.metric, falls=self.cfg.target.falls,
            planned_epochs=plan["epochs"],
            checkpoint_every_s=self.cfg.trainer.checkpoint_every_s,
            deadline=pruning.deadline, decide=pruning.decide, cap=pruning.within_timeout,
            listeners=(lambda kind, msg: self._emit("report", trial, kind, msg),))

        def idle() -> None:
            self._check_stop_now(study)
            if self._interrupted.is_set() and not asked and channel.connected:
                channel.request("checkpoint")
                asked.append(True)

        bad: str | None = None
        alone = False     # the trainer closed the channel or exited without its end report
        try:
            for msg in channel.messages(process, lambda: limits.until, idle):
                bad = protocol.report_problem(msg, self.cfg.target.metric,
                                              self.cfg.target.falls)
                if bad is not None:
                    break       # the trainer is stopped: it cannot be followed further
                if msg.get("type") == "end":
                    end = msg
                    channel.reply(protocol.ACK)
                    break     # warm ranks now wait for the next plan; others exit
                if msg.get("type") == "start":
                    limits.training()
                reply = handler.answer(msg)
                if reply is not None:
                    channel.reply(reply)
            else:
                alone = end is None and time.monotonic() <= limits.until
        finally:
            code = self.ranks.finish(launched, end, folder, serves=handler.serves,
                                     keep=not self._interrupted.is_set()
                                     and not writes.given_up, grace=alone)
            writes.flush(None)
        stop_reason = handler.stop_reason
        if (end is not None and end.get("reason") == "bound" and self.stop_at is not None
                and time.monotonic() >= self.stop_at - 1.0):
            end = {**end, "reason": "stopped"}       # it was the study's deadline, not the best
            stop_reason = "study_timeout"
        last = handler.curve[-1] if handler.curve else []
        fell = isinstance(self.pruner, TimeToAccuracyPruner) and stop_reason == "diverged" \
            and self.pruner.collapsed(handler.curve)
        result = classify(trial.number, end, code, process.cause() if end is None else "",
                          handler.best, handler.evals, stop_reason,
                          loss=last[4] if len(last) > 4 else None, collapsed=fell)
        if bad is not None:
            result = TrialResult(trial.number, {}, "failed", "bad_report",
                                 best_metric=handler.best, evals=handler.evals,
                                 detail=f"the trainer sent {bad}: {process.tail()}")
        elif end is None and time.monotonic() > limits.until:   # killed at its limit: say so
            limits.explain(result, channel, launched_at)
        result.curve = handler.curve
        return result
