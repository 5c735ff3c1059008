"""The contract between a worker and the trainer ranks it runs: the plan, the messages rank 0
sends over the report channel (:mod:`trainers.reporter`) and the worker's replies, and when
warm ranks leave instead of serving the next plan. Both ends build and read them here.

Messages (rank 0 to the worker), each answered once except the setup notes:

* ``setup``: ``{"type": "setup", "phase", "at_s"}`` as setup enters each phase; no reply;
* ``start``: after setup, with ``setup_s``, ``setup_phases``, ``serves`` (whether the ranks
  will wait for another plan after this trial), ...; answered by a decision;
* ``eval``: after each evaluation; answered by a decision;
* ``checkpoint``: a periodic checkpoint was saved (``path``, ``elapsed_s``); answered by ack;
* ``end``: the trial's end (``reason``, ...); answered by ack;
* ``ready``: warm ranks wait for a plan; answered by :func:`plan_reply` or :data:`EXIT`.

A decision is ``{"action": "continue" | "stop" | "checkpoint", "reason", "deadline_s"}``:
go on, stop, or save a checkpoint and go on; ``deadline_s`` is the elapsed time after which
the trainer stops on its own between evaluations (None: no deadline).
"""

from __future__ import annotations

import math
import re
from typing import Any, TypedDict

__all__ = ["ACK", "EXIT", "LEAVE_AFTER", "Plan", "Reply", "ZERO_INIT_MODELS", "decision", "go",
           "falling_name", "falls", "leaves_after", "metric_problem", "plan_reply",
           "ranks_stay", "reaches", "report_problem", "stop"]

Reply = dict[str, Any]

ACK: Reply = {"action": "ack"}
EXIT: Reply = {"action": "exit"}

# Trial ends after which warm ranks leave rather than serve another plan: a checkpointed stop
# (the worker is going away, or the trial resumes elsewhere) and an out-of-memory end (the
# allocator's state is not to be trusted by the next trial).
LEAVE_AFTER = ("checkpointed", "oom")

# torchvision models that take the plan's zero_init_residual (the ResNet family: each block's
# last BatchNorm starts at 0); the others have no such block.
ZERO_INIT_MODELS = ("resnet", "resnext", "wide_resnet")


def leaves_after(reason: str | None) -> bool:
    """Whether warm ranks leave after a trial that ended with ``reason``."""
    return reason in LEAVE_AFTER


def ranks_stay(serves: bool, end: dict[str, Any] | None) -> bool:
    """Whether ranks that ran a trial wait for the next plan: their start report said they
    serve, the trial reported its end, and that end does not make them leave."""
    return serves and end is not None and not leaves_after(end.get("reason"))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and \
        math.isfinite(float(value)) and value >= 0


# Names of metrics that fall as training goes on: a target on one needs mode min.
_FALLING = re.compile(r"(^|_)(loss|error|err|entropy|xent|perplexity|ppl|wer|cer|mse|mae|rmse|"
                      r"fid|nll)($|_)", re.IGNORECASE)


def falling_name(metric: str) -> bool:
    """Whether ``metric`` is named as a metric that falls (a loss, an error rate, WER,
    perplexity, FID): its target needs ``mode: min``."""
    return bool(_FALLING.search(metric))


def falls(target: Any) -> bool:
    """Whether a plan's (or a study file's) target metric falls to its value: ``mode: min``,
    for a loss, an error rate or a perplexity; else it is an accuracy that rises to it."""
    return isinstance(target, dict) and target.get("mode") == "min"


def reaches(value: float, target: float, falling: bool) -> bool:
    """Whether an evaluation's ``value`` of the target metric meets the ``target``: at or
    above it for an accuracy, at or below it for a metric that falls (NaN never does)."""
    if not math.isfinite(value):
        return False
    return value <= target if falling else value >= target


def metric_problem(value: float, falling: bool) -> str | None:
    """What is wrong with a finite reported value of the target metric (None: nothing): an
    accuracy is a share from 0 to 1; a falling metric (a loss) is 0 or more."""
    if not math.isfinite(value):
        return None
    if falling and value < 0:
        return ("a target metric that falls (mode: min: a loss, an error rate, a perplexity) "
                "is 0 or more")
    if not falling and not 0 <= value <= 1:
        return ("the target metric is an accuracy, a share from 0 to 1 (a percentage divided "
                "by 100; for a metric that falls, such as a loss, give the target mode: min)")
    return None


def report_problem(msg: dict[str, Any], metric: str, falling: bool = False) -> str | None:
    """What is wrong with a report from a trainer, for the worker to fail the trial with it
    (None: nothing). ``metric``: the study's target metric, which every evaluation carries
    (``falling``: it falls to its target, ``mode: min``)."""
    kind = msg.get("type")
    if kind not in ("start", "eval", "checkpoint", "end", "ready"):
        shown = msg.get("line", msg)
        return (f"a report of unknown type {kind!r} ({str(shown)[:120]}); a trainer sends "
                "start, eval, checkpoint and end (trainers.api does)")
    if kind == "start" and msg.get("resumed_at_s") is not None \
            and not _number(msg.get("resumed_at_s")):
        return f"a start report whose resumed_at_s is {msg.get('resumed_at_s')!r}"
    if kind == "eval":
        value = msg.get(metric)
        if not (isinstance(value, int | float) and not isinstance(value, bool)):
            return (f"an evaluation without the target metric {metric!r} as a number "
                    f"(got {value!r}; keys: {', '.join(map(str, msg))})")
        wrong = metric_problem(float(value), falling)
        if wrong is not None:
            return f"an evaluation whose {metric} is {value:g}; {wrong}"
        if not _number(msg.get("elapsed_s")):
            return f"an evaluation whose elapsed_s is {msg.get('elapsed_s')!r}"
        if not _number(msg.get("epoch")):
            return (f"an evaluation whose epoch (epochs done, a number >= 0) is "
                    f"{msg.get('epoch')!r}")
        index = msg.get("index")
        if not (isinstance(index, int) and not isinstance(index, bool) and index >= 0):
            return f"an evaluation whose index (0, 1, 2, ...) is {index!r}"
    if kind == "checkpoint" and not (isinstance(msg.get("path"), str)
                                     and _number(msg.get("elapsed_s"))):
        return f"a checkpoint report without a path and elapsed_s ({str(msg)[:120]})"
    if kind == "end":
        reason = msg.get("reason")
        if not isinstance(reason, str) or not reason:
            return f"an end report without a reason ({str(msg)[:120]})"
        if not _number(msg.get("elapsed_s")):
            return f"an end report whose elapsed_s is {msg.get('elapsed_s')!r}"
        if reason == "reached" and not _number(msg.get("tta_s")):
            return f"an end report that reached without a tta_s ({msg.get('tta_s')!r})"
    return None


def decision(action: str, reason: str = "", deadline_s: float | None = None) -> Reply:
    """The worker's answer to a start or evaluation report."""
    return {"action": action, "reason": reason, "deadline_s": deadline_s}


def go(deadline_s: float | None = None) -> Reply:
    """Go on (until ``deadline_s`` of elapsed time, if given)."""
    return decision("continue", "", deadline_s)


def stop(reason: str, deadline_s: float | None = None) -> Reply:
    """Stop now, for ``reason``."""
    return decision("stop", reason, deadline_s)


def and_checkpoint(reply: Reply) -> Reply:
    """``reply``'s go-on turned into: save a checkpoint, then go on."""
    return {**reply, "action": "checkpoint"}


def goes_on(reply: Reply) -> bool:
    """Whether ``reply`` lets the trial go on as it is."""
    return reply["action"] == "continue"


def plan_reply(plan: dict[str, Any]) -> Reply:
    """The answer to warm ranks' ``ready``: the next trial's plan."""
    return {"action": "plan", "plan": plan}


class Schedule(TypedDict):
    warmup_steps: int
    total_steps: int
    warmup_start_factor: float
    decay: str                  # cosine | linear | poly | step | constant
    power: float
    milestones: list[float]
    gamma: float
    final_lr_factor: float


class Optimizer(TypedDict):
    name: str                   # sgd | lars | lamb
    momentum: float
    nesterov: bool
    weight_decay: float
    trust_coefficient: float


class Plan(TypedDict):
    """Every key of a resolved plan, as ``autotune.plan.resolve`` writes it (JSON)."""

    params: dict[str, Any]      # the sampled point
    model: str                  # a torchvision classification model
    weights: str                # a state dict file the model starts from; "": from scratch
    num_classes: int | None     # None: a script's own examples of no stated classes
    data: dict[str, Any]        # the data source (trainer.data)
    augment: str                # none | flip | crop | crop_flip | imagenet
    device: str                 # cpu | cuda
    threads_per_rank: int
    world_size: int
    global_batch: int           # micro_batch x grad_accum x world_size
    micro_batch: int
    grad_accum: int
    train_size: int
    steps_per_epoch: int
    epochs: int
    total_steps: int
    peak_lr: float
    schedule: Schedule
    optimizer: Optimizer
    no_wd_on_bn_bias: bool
    zero_init_residual: bool
    label_smoothing: float
    image_sizes: list[int]      # training resolution of each epoch; []: the data's own
    eval_size: int              # evaluation resolution; 0: the data's own
    target: dict[str, Any]      # {"metric": top1 | top5 | a script's own, "value": float,
                                #  "mode": max | min (min: the metric falls to the value)}
    eval_every_steps: int       # 0 and eval_every_s 0: the default cadence
    eval_every_s: float
    eval_batch: int
    max_seconds: float          # the trial's cap on training seconds; 0: none
    seed: int
    precision: str              # bf16 | fp32
    compile: bool
    serve: bool                 # the worker asks the ranks to wait for its next plan after
                                # this trial (autotune.ranks); written at the launch
    checkpoint_dir: str | None
    resume_from: str | None     # a step-N checkpoint folder to continue from
    model_path: str | None      # where a trial that reaches the target saves its model
                                # (trainers.models.save_model); None: not saved
    deepspeed: dict[str, Any]   # DeepSpeed's config, generated from the above
