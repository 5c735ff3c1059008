"""Image classification trainer, started by the ``deepspeed`` launcher.

    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 trainers/image_classifier.py --plan plan.json

The plan (JSON, written by autotune's worker) fixes everything: model, data, global batch as
micro-batch x accumulation x world size, optimizer, peak LR and schedule, label smoothing,
target, evaluation frequency, time limits, precision, augmentation, the image size of each
epoch (progressive resizing, switched between epochs in the same loader processes) and of
evaluation, and where to checkpoint (its keys: :class:`trainers.protocol.Plan`). Rank 0 notes
each setup phase and reports every evaluation through :mod:`trainers.reporter`
(``--report-to HOST:PORT``; without it, JSON lines on stdout). With no evaluation cadence in
the plan, it evaluates after every epoch and, within an epoch, as
:func:`trainers.schedule.eval_interval` says (often enough for the trial's cap).

Time accounting: the clock starts when rank 0 begins the first training step, after the
process group, model and data are ready (that setup is ``setup_s``). Evaluation time counts.
Time spent waiting for the worker's reply is not training: it is reported as ``control_s`` and
left out of ``elapsed_s``. The trial's time-to-accuracy is ``elapsed_s`` at the end of the
first evaluation whose target metric reaches the target. A resumed run continues the clock
where its checkpoint left it.

Checkpoints: on SIGTERM, or when the worker asks (a ``checkpoint`` message at any time: save
and stop; or a ``checkpoint`` action in a reply: save and go on), every rank saves its part
(DeepSpeed's model, optimizer and scheduler state; each rank's RNG states; the data position
and the clock) in a new folder ``step-N`` under ``plan["checkpoint_dir"]``, and the older ones
are removed once it is complete, so a crash mid-save leaves the previous checkpoint intact.
After a save-and-go-on, rank 0 reports ``{"type": "checkpoint", "path", "elapsed_s"}``. The
time a periodic save takes is control time, left out of ``elapsed_s``. A plan with
``resume_from`` (a ``step-N`` folder) continues from that checkpoint.

Warm ranks (the plan's ``serve``): after a trial ends, rank 0 tells the worker it is ``ready`` and
waits; the worker's reply is the next trial's plan (``{"action": "plan", "plan": {...}}``),
which rank 0 passes to every rank, or ``{"action": "exit"}``. The next trial then starts in the
same processes: no launcher, interpreter, import or process-group start, and the data source
is kept when the plan's data are the same. The ranks leave instead of serving after a
checkpointed or out-of-memory end, on SIGTERM, or when the channel closes.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import signal
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # started as a script by the launcher
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from trainers._lifeline import die_with_parent

    die_with_parent()             # the launcher gone (its worker killed): this rank goes too

import torch
import torch.distributed as dist

from trainers import _checkpoint, noise
from trainers._control import CHECKPOINT, DIVERGED, GO, OOM, REASONS, STOPPED, Control
from trainers._rank import Clock, agree, is_oom, next_plan
from trainers.models import build_engine, evaluate
from trainers.reporter import Reporter, connect
from trainers.schedule import eval_interval
from trainers.sources import Source, kept_source

_SERVED = [0]                     # trials this process has begun (more than 1: warm ranks)


class Trainer:
    """One rank of one trial."""

    def __init__(self, plan: dict[str, Any], reporter: Reporter, serves: bool = False) -> None:
        self.serves = serves   # after this trial, the ranks wait for the worker's next plan
        _SERVED[0] += 1
        self.plan = plan
        self.reporter = reporter
        self.wall0 = time.perf_counter()
        # Everything a checkpoint carries besides the model, optimizer and RNG states. Rank 0's
        # copy is the one saved; control_s counts control time before the last resume.
        self.state: dict[str, Any] = {"epoch": 0, "step_in_epoch": 0, "step": 0, "evals": 0,
                                      "elapsed": 0.0, "train_s": 0.0, "eval_s": 0.0,
                                      "control_s": 0.0, "best": {"top1": 0.0, "top5": 0.0},
                                      "last_eval_at": 0.0, "deadline": -1.0}
        self.phases: dict[str, float] = {}   # setup phase -> seconds after the start it began
        self.augment = str(plan["augment"])   # resolved by the worker (autotune.plan)
        self.last_eval_cost = 0.0

    def _phase(self, name: str) -> None:
        """Setup reached ``name``: rank 0 tells the worker (no reply), so a setup that runs
        past its limit is reported with the phase it was in."""
        self.phases[name] = time.perf_counter() - self.wall0
        if getattr(self, "rank", int(os.environ.get("RANK", 0))) == 0:
            self.reporter.note({"type": "setup", "phase": name,
                                "at_s": self.phases[name]})

    # -- setup --------------------------------------------------------------------------------
    def setup(self) -> None:
        plan = self.plan
        self.on_gpu = plan["device"] == "cuda"
        self._phase("distributed")
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if self.on_gpu else "gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.world != plan["world_size"]:
            raise SystemExit(f"the plan is for {plan['world_size']} ranks, but {self.world} "
                             "started")
        torch.manual_seed(plan["seed"])
        random.seed(plan["seed"])
        if self.on_gpu:
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(self.device)
            torch.backends.cudnn.benchmark = True
        else:
            self.device = torch.device("cpu")
            torch.set_num_threads(int(plan["threads_per_rank"]))
        self._phase("data")
        self.source: Source = kept_source(plan["data"], self.on_gpu)
        self._phase("model")
        self.engine, self.scheduler = build_engine(plan, self.source.num_classes, self.device,
                                                   self.world, on_phase=self._phase)
        # The gradient noise scale needs two batch sizes (ranks) and the gradients in the
        # parameters (fp32: bf16 training accumulates them inside DeepSpeed's optimizer).
        self.noise = (noise.NoiseScale(plan["micro_batch"] * plan["grad_accum"], self.world)
                      if self.world > 1 and not plan["deepspeed"]["bf16"]["enabled"] else None)
        self.noise_cost = 0.0
        self.forward = self.engine
        self.criterion = torch.nn.CrossEntropyLoss(label_smoothing=plan["label_smoothing"])
        if plan["resume_from"]:
            self._phase("resume")
            self.state.update(_checkpoint.load(self.engine, Path(plan["resume_from"]),
                                               self.rank, self.on_gpu))
        self.control = Control(self.reporter, self.rank, self.state, plan["max_seconds"])
        signal.signal(signal.SIGTERM, self.control.on_sigterm)

    def size_of(self, epoch: int) -> int | None:
        """The training resolution of ``epoch`` (None: the data's own)."""
        sizes = self.plan["image_sizes"]
        return int(sizes[min(epoch, len(sizes) - 1)]) if sizes else None

    def _autocast(self) -> Any:
        if self.on_gpu and self.plan["precision"] == "bf16":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def _to_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        if self.on_gpu:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y

    # -- checkpoints --------------------------------------------------------------------------
    def save(self, clock: Clock) -> tuple[float, str]:
        """Saves a checkpoint; returns the elapsed seconds it holds (a resume starts there) and
        its folder."""
        state = {**self.state, "elapsed": clock.elapsed(),
                 "control_s": self.state["control_s"] + clock.control_s}
        folder = _checkpoint.save(self.engine, Path(self.plan["checkpoint_dir"]), state,
                                  self.rank, self.on_gpu)
        return float(state["elapsed"]), folder

    def _prune_checkpoints(self, keep: str) -> None:
        if self.rank == 0:
            _checkpoint.prune(Path(self.plan["checkpoint_dir"]), keep)

    # -- evaluation ---------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Top-1, top-5 and mean loss over the whole validation set (``models.evaluate``)."""
        batches = self.source.eval_batches(self.rank, self.world, self.plan["eval_batch"],
                                           self.augment, self.plan["eval_size"] or None)
        return evaluate(self.engine, (self._to_device(x, y) for x, y in batches), self.world,
                        self.device, self._autocast)

    # -- training -----------------------------------------------------------------------------
    def _step(self, batches: Any) -> int:
        """One optimizer step (``grad_accum`` micro-batches); a stop code."""
        for micro_step in range(self.plan["grad_accum"]):
            x, y = self._to_device(*next(batches))
            try:
                with self._autocast():
                    loss = self.criterion(self.forward(x), y)
                code = GO if math.isfinite(loss.item()) else DIVERGED
            except RuntimeError as e:
                if not is_oom(e):
                    raise
                code = OOM
            code = agree(code)[0]
            if code != GO:
                return code  # every rank leaves before backward: no collective hangs
            scale = self.noise if micro_step == self.plan["grad_accum"] - 1 else None
            measure = scale is not None and scale.due(self.state["step"])
            try:
                if measure:   # the all-reduce waits until this rank's own norm is taken
                    self.engine.enable_backward_allreduce = False
                self.engine.backward(loss)
                if scale is not None and measure:
                    self.engine.enable_backward_allreduce = True
                    self.noise_cost = noise.measure(scale, self.engine, self.world)
                self.engine.step()
            except RuntimeError as e:
                if not is_oom(e):
                    raise
                return OOM  # out of memory in backward: the other ranks fail the same way
        return GO

    def run(self) -> dict[str, Any]:
        plan, st = self.plan, self.state
        micro, accum, spe = plan["micro_batch"], plan["grad_accum"], plan["steps_per_epoch"]
        every_steps, every_s = int(plan["eval_every_steps"]), float(plan["eval_every_s"])
        auto = not every_steps and not every_s   # no cadence set: see eval_interval
        if auto:
            every_steps = spe
        control = self.control
        clock = control.start({
            "setup_s": time.perf_counter() - self.wall0, "world_size": self.world,
            "hosts": [os.uname().nodename], "pid": os.getpid(), "served": _SERVED[0],
            "serves": self.serves, "setup_phases": self.phases, "augment": self.augment,
            "resumed_at_s": st["elapsed"] if plan["resume_from"] else None})
        setup_s = time.perf_counter() - self.wall0
        samples_since, train_since = 0, 0.0
        reason, reached_at, stop = "planned_epochs", None, GO
        while st["epoch"] < plan["epochs"] and stop == GO and reason != "reached":
            size = self.size_of(st["epoch"])
            batches = self.source.train_batches(st["epoch"], plan["seed"], self.rank, self.world,
                                                spe * micro * accum, micro,
                                                skip=st["step_in_epoch"] * accum,
                                                augment=self.augment, size=size)
            if plan.get("shard_log"):  # an audit trail: which samples this rank trains on
                with open(f"{plan['shard_log']}.rank{self.rank}", "a") as log:
                    log.write(json.dumps({"epoch": st["epoch"],
                                          "indices": self.source.last_order.tolist()}) + "\n")
            while st["step_in_epoch"] < spe:
                t = time.perf_counter()
                self.noise_cost = 0.0
                code = self._step(batches)
                if self.noise is not None and self.noise_cost:   # the same step on every rank
                    pace = self.noise.pace(self.noise_cost, time.perf_counter() - t)
                    self.noise.schedule(st["step"], agree(pace)[0])
                st["step"] += 1
                st["step_in_epoch"] += 1
                gap = eval_interval(plan["max_seconds"], self.last_eval_cost) if auto else every_s
                code, due = control.after_step(code, clock, gap)
                dt = time.perf_counter() - t
                st["train_s"] += dt
                train_since += dt
                samples_since += micro * accum * self.world
                if code != GO:
                    stop = code
                    break
                last = st["step"] == plan["total_steps"]
                if due or (every_steps and st["step"] % every_steps == 0) or last:
                    action = self._evaluate_and_report(clock, samples_since, train_since)
                    samples_since, train_since = 0, 0.0
                    if action == "reached":
                        reached_at, reason = st["last_eval_at"], "reached"
                        break
                    if action == "stop":
                        stop = STOPPED
                        break
                    if action == "checkpoint":
                        control.checkpoint(clock, lambda: self.save(clock),
                                           self._prune_checkpoints)
            else:
                st["epoch"] += 1
                st["step_in_epoch"] = 0
        saved_at, saved_in = self.save(clock) if stop == CHECKPOINT else (None, None)
        if plan.get("save_model") and self.rank == 0:
            torch.save(self.engine.module.state_dict(), plan["save_model"])
        summary = {"type": "end", "reason": REASONS.get(stop, reason), "tta_s": reached_at,
                   "setup_s": setup_s, "train_s": st["train_s"], "eval_s": st["eval_s"],
                   "control_s": st["control_s"] + clock.control_s,
                   "elapsed_s": clock.elapsed(),
                   "wall_s": time.perf_counter() - self.wall0, "steps": st["step"],
                   "evals": st["evals"], "best_top1": st["best"]["top1"],
                   "best_top5": st["best"]["top5"], "micro_batch": micro}
        if self.noise is not None and self.noise.value:
            summary["noise_scale"] = self.noise.value
            summary["noise_cost_s"] = self.noise.cost_s
        if saved_at is not None:
            summary["checkpoint"] = saved_in
            summary["checkpoint_elapsed_s"] = saved_at
        control.end(summary, self._prune_checkpoints)
        return summary

    def _evaluate_and_report(self, clock: Clock, samples: int, train_s: float) -> str:
        """Evaluates, reports (rank 0), and returns the agreed action: go, stop, reached or
        checkpoint."""
        plan, st = self.plan, self.state
        t = time.perf_counter()
        metrics = self.evaluate()
        self.last_eval_cost = time.perf_counter() - t
        st["eval_s"] += self.last_eval_cost
        st["evals"] += 1
        for k in ("top1", "top5"):
            st["best"][k] = max(st["best"][k], metrics[k])
        size = self.size_of(st["epoch"])
        fields = {"index": st["evals"] - 1, "epoch": st["step"] / plan["steps_per_epoch"],
                  **({"image_size": size} if size else {}),
                  **({"noise_scale": self.noise.value}
                     if self.noise is not None and self.noise.value else {}),
                  "step": st["step"], "samples": st["step"] * plan["global_batch"],
                  "lr": self.scheduler.get_last_lr()[0],
                  "images_per_s": samples / max(train_s, 1e-9), **metrics}
        reached = metrics[plan["target"]["metric"]] >= plan["target"]["value"]
        return self.control.report_eval(clock, fields, reached)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="path of the resolved plan (JSON)")
    parser.add_argument("--report-to", default=None,
                        help="HOST:PORT of the worker's report channel (default: stdout)")
    parser.add_argument("--local_rank", type=int, default=0, help="set by the launcher")
    args = parser.parse_args(argv)
    plan: dict[str, Any] | None = json.loads(Path(args.plan).read_text())
    rank = int(os.environ.get("RANK", 0))
    reporter = connect(args.report_to) if rank == 0 else connect(None)
    try:
        while plan is not None:
            # warm ranks: the worker asks in the plan; they serve only with a worker to ask
            serves = bool(plan.get("serve")) and args.report_to is not None
            trainer = Trainer(plan, reporter, serves=serves)
            trainer.setup()
            summary = trainer.run()
            if trainer.control.terminate:
                summary["reason"] = "checkpointed"  # SIGTERM: leave, whatever the end
            del trainer  # the engine, optimizer and model go before the next trial's
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            plan = next_plan(reporter, summary) if serves else None
    finally:
        reporter.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Skip the interpreter's teardown (seconds of torch and gloo finalizers on a CPU): all the
    # trial wrote is closed by now, and the worker waits for this exit to start its next trial.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
