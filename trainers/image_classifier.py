"""Image classification trainer, started by the ``deepspeed`` launcher.

    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 trainers/image_classifier.py --plan plan.json

The plan (JSON, written by autotune's worker) fixes everything: model, data, global batch as
micro-batch x accumulation x world size, optimizer, peak LR and schedule, label smoothing,
target, evaluation frequency, time limits, precision, augmentation, the image size of each
epoch (progressive resizing, switched between epochs in the same loader processes) and of
evaluation, and where to checkpoint (its keys: :class:`trainers.protocol.Plan`).

It is a script on :mod:`trainers.api`, like any user's: the API keeps the clock (from the
first training step; waiting for the worker and periodic checkpoints left out; a resumed run
continues it), sends the start, evaluation, checkpoint and end reports, agrees every stop
across ranks, saves and resumes checkpoints (``step-N`` folders: DeepSpeed's model, optimizer
and scheduler state through this trainer's hooks, and the API's own state and RNGs) and
serves the worker's next plan in the same ranks. What is this trainer's own: the DeepSpeed
engine and its step, with a non-finite loss (``diverged``) or an out-of-memory error (``oom``)
agreed by every rank before backward; the gradient noise scale; the data source for each
epoch's image size, kept across warm trials when the data are the same; and evaluations of
top-1, top-5 and loss over the whole validation set. Without ``--report-to``, reports are
JSON lines on stdout.
"""

from __future__ import annotations

import json
import math
import os
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

from trainers import api, noise
from trainers._control import DIVERGED, GO, OOM, REASONS
from trainers._grads import FlatGrads
from trainers._rank import agree, is_oom
from trainers.models import build_engine, evaluate, save_model
from trainers.sources import Source, kept_source


class Trainer:
    """One rank of one trial, driven through :mod:`trainers.api` like any script."""

    def __init__(self, trial: api.Trial) -> None:
        self.trial = trial
        self.plan = trial.plan
        self.augment = str(self.plan["augment"])   # resolved by the worker (autotune.plan)

    # -- setup --------------------------------------------------------------------------------
    def setup(self) -> None:
        plan, trial = self.plan, self.trial
        self.on_gpu = trial.on_gpu
        trial.note("distributed")
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if self.on_gpu else "gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.world != plan["world_size"]:
            raise SystemExit(f"the plan is for {plan['world_size']} ranks, but {self.world} "
                             "started")
        self.device = trial.device
        if self.on_gpu:
            torch.cuda.set_device(self.device)
            torch.backends.cudnn.benchmark = True
        trial.note("data")
        self.source: Source = kept_source(plan["data"], self.on_gpu)
        trial.note("model")
        self.engine, self.scheduler = build_engine(plan, self.source.num_classes, self.device,
                                                   self.world, on_phase=trial.note)
        # The gradient noise scale needs two batch sizes: two ranks or more (fp32 or bf16).
        self.noise = (noise.NoiseScale(plan["micro_batch"] * plan["grad_accum"], self.world)
                      if self.world > 1 else None)
        self.noise_cost = 0.0
        # fp32 on several ranks: gradients in one flat buffer, all-reduced in place (_grads)
        self.flat = (FlatGrads(list(self.engine.module.parameters()), self.world)
                     if self.world > 1 and FlatGrads.usable(self.engine) else None)
        if self.flat is not None:
            self.engine.enable_backward_allreduce = False
        self.forward = self.engine
        self.criterion = torch.nn.CrossEntropyLoss(label_smoothing=plan["label_smoothing"])
        trial.checkpointing(save=self._save, load=self._load)

    def _save(self, folder: Path) -> None:
        """DeepSpeed's model, optimizer and scheduler state, every rank its part."""
        self.engine.save_checkpoint(str(folder.parent), tag=folder.name)

    def _load(self, folder: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(folder.parent), tag=folder.name)
        if path is None:
            raise SystemExit(f"{folder} holds no DeepSpeed checkpoint to resume from")

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
        step, flat = self.trial.step, self.flat
        for micro_step in range(self.plan["grad_accum"]):
            if flat is not None and micro_step == 0:
                flat.attach()   # no gradients: backward's first ones go into the buffer
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
            last = micro_step == self.plan["grad_accum"] - 1
            scale = self.noise if last else None
            measure = scale is not None and scale.due(step)
            try:
                if flat is not None and last:   # buckets all-reduced as backward fills them
                    flat.arm(measure)
                elif measure:   # DeepSpeed's all-reduce waits for this rank's own norm
                    self.engine.enable_backward_allreduce = False
                # the flat buffer's all-reduce sums: the loss carries the 1/ranks
                self.engine.backward(loss if flat is None else loss * flat.scale)
                if flat is not None and last:
                    own = flat.finish()
                    if scale is not None and own is not None:
                        self.noise_cost = flat.norm_s + noise.record(scale, own, flat.grads())
                elif scale is not None and measure:
                    self.engine.enable_backward_allreduce = True
                    self.noise_cost = noise.measure(
                        scale, lambda: noise.reduced_grads(self.engine),
                        self.engine.allreduce_gradients)
                self.engine.step()
            except RuntimeError as e:
                if not is_oom(e):
                    raise
                return OOM  # out of memory in backward: the other ranks fail the same way
        return GO

    def run(self) -> dict[str, Any]:
        """Trains until the trial ends; returns its end report."""
        plan, trial = self.plan, self.trial
        micro, accum, spe = plan["micro_batch"], plan["grad_accum"], plan["steps_per_epoch"]
        trial.start(augment=self.augment)
        epoch, batches = -1, None
        self.evaluated: dict[str, Any] = {}     # the last evaluation's metrics
        while trial.running:
            if trial.epoch != epoch:
                epoch = trial.epoch
                batches = self.source.train_batches(
                    epoch, plan["seed"], self.rank, self.world, spe * micro * accum, micro,
                    skip=trial.step_in_epoch * accum, augment=self.augment,
                    size=self.size_of(epoch))
                if plan.get("shard_log"):  # an audit trail: which samples this rank trains on
                    with open(f"{plan['shard_log']}.rank{self.rank}", "a") as log:
                        log.write(json.dumps({"epoch": epoch,
                                              "indices": self.source.last_order.tolist()})
                                  + "\n")
            t = time.perf_counter()
            self.noise_cost = 0.0
            step = trial.step
            code = self._step(batches)
            if self.noise is not None and self.noise_cost:   # the same step on every rank
                pace = self.noise.pace(self.noise_cost, time.perf_counter() - t)
                self.noise.schedule(step, agree(pace)[0])
            if code != GO:
                trial.stop(REASONS[code])
            if trial.step_done():
                self.evaluated = self._eval_fields()
                trial.report(**self.evaluated)
        if plan.get("save_model") and self.rank == 0:
            torch.save(self.engine.module.state_dict(), plan["save_model"])
        extra: dict[str, Any] = {"best_top1": trial.state["best"].get("top1", 0.0),
                                 "best_top5": trial.state["best"].get("top5", 0.0)}
        if plan.get("model_path") and trial.reason == "reached" \
                and self._save_model(str(plan["model_path"])):
            extra["model_path"] = str(plan["model_path"])
        skipped = self._unreadable()
        if skipped:
            extra["unreadable_images"] = skipped
        if self.noise is not None and self.noise.measurements:
            extra["noise_cost_s"] = self.noise.cost_s   # spent even before an estimate shows
            if self.noise.value:
                extra["noise_scale"] = self.noise.value
        return trial.end(**extra)

    def _save_model(self, path: str) -> bool:
        """The model that reached the target, as evaluated (every rank holds rank 0's buffers
        then), saved by rank 0 to ``path`` (``models.save_model``); the others wait for it.
        A save that fails (a full disk) is named in the log and leaves the result as it is."""
        saved = True
        if self.rank == 0:
            try:
                save_model(path, self.engine.module, self.plan, self.source.class_names(),
                           tta_s=self.trial.reached_at, evaluation={
                               k: v for k, v in self.evaluated.items()
                               if k in ("top1", "top5", "loss", "image_size")})
            except (OSError, RuntimeError) as e:
                print(f"autotune: could not save the model to {path} ({e}); the trial's "
                      "result stands, without its model", file=sys.stderr, flush=True)
                saved = False
        if self.world > 1:
            dist.barrier()
        return saved

    def _unreadable(self) -> int:
        """How many files the ranks could not decode and skipped, each counted once (a file
        two ranks met in different epochs too). Every rank calls it at the same point: the
        sources that skip files (ImageFolder's) are the same on every rank."""
        skipped = getattr(self.source, "unreadable", None)
        if skipped is None:
            return 0
        if self.world == 1:
            return len(skipped)
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, sorted(skipped))
        return len(set().union(*gathered))

    def _eval_fields(self) -> dict[str, Any]:
        """An evaluation's metrics and what goes with them in the report."""
        metrics = self.evaluate()
        size = self.size_of((self.trial.step - 1) // self.plan["steps_per_epoch"])
        return {**({"image_size": size} if size else {}),
                **({"noise_scale": self.noise.value}
                   if self.noise is not None and self.noise.value else {}),
                "lr": self.scheduler.get_last_lr()[0], **metrics}


def main(argv: list[str] | None = None) -> int:
    for trial in api.trials(argv):
        trainer = Trainer(trial)
        trainer.setup()
        trainer.run()
        del trainer  # the engine, optimizer and model go before the next trial's
    return 0


if __name__ == "__main__":
    code = main()
    # Skip the interpreter's teardown (seconds of torch and gloo finalizers on a CPU): all the
    # trial wrote is closed by now, and the worker waits for this exit to start its next trial.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
