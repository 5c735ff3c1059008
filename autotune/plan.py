"""From sampled parameters to a training plan: pure decisions, no side effects.

A plan is a JSON-ready dict that a trainer follows exactly: the global batch decomposed into
micro-batch x gradient accumulation x world size, the peak LR from the scaling rule, the warmup
and decay schedule over the planned epochs, the optimizer, label smoothing, the target and the
time limits, the image size of each epoch (progressive resizing) and of evaluation, plus the
DeepSpeed config generated from all of that.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainers.augment import AUGMENTATIONS
from trainers.augment import DEFAULTS as AUGMENT_DEFAULTS
from trainers.schedule import DECAYS, RESOLUTION_MODES, image_sizes, lr_at

from .errors import PlanError

__all__ = ["PARAMETERS", "SCALING_RULES", "Hardware", "scale_lr", "split_batch", "resolve",
           "derived_params", "name_problems", "schedule_problems", "value_problems"]

SCALING_RULES = ("linear", "sqrt", "none")
OPTIMIZERS = ("sgd", "lars", "lamb")

# Parameters a search space may set, with the value used when it does not.
PARAMETERS: dict[str, Any] = {
    "global_batch": None,          # images per optimizer step, over all ranks (required)
    "lr_per_256": None,            # peak LR per 256 images, before the scaling rule (required)
    "epochs": None,                # planned epochs: the schedule ends there (required)
    "lr_scaling": "linear",        # linear | sqrt | none
    "warmup_epochs": 0.0,          # linear warmup length, in epochs
    "warmup_start_factor": 0.0,    # warmup starts at this fraction of the peak LR
    "decay": "cosine",             # cosine | linear | poly | step | constant
    "decay_power": 2.0,            # for poly
    "final_lr_factor": 0.0,        # decay ends at this fraction of the peak LR
    "label_smoothing": 0.0,
    "optimizer": "sgd",
    "momentum": 0.9,
    "nesterov": False,
    "weight_decay": 5e-5,
    "lars_trust_coefficient": 0.001,  # LARS: layer LR = lr x coefficient x |w| / |update|
    "grad_clip_norm": 0.0,         # clip the global gradient norm to this; 0: no clipping
    "augment": "",                 # none | flip | crop | crop_flip | imagenet; "": what
                                   # trainer.data says, or its source's default
    # Progressive resizing (trainers.schedule.image_sizes): 0 sizes mean the data's own.
    "res_start": 0,                # training resolution (px) at the start; 0: no schedule
    "res_end": 0,                  # ... from res_ramp_end on; 0: res_start
    "res_mid": 0,                  # step mode: the size between the two steps; 0: none
    "res_ramp_start": 0.0,         # share of the planned epochs where the ramp (step) starts
    "res_ramp_end": 1.0,           # ... where it ends (the second step)
    "res_mode": "linear",          # linear | step
    "eval_res": 0,                 # evaluation resolution (px); 0: the data's own
}
# Models that take one input size only: no resolution schedule for them.
FIXED_SIZE_MODELS = ("vit_", "maxvit_")
MIN_SIZE, MAX_SIZE = 8, 1024
REQUIRED = tuple(k for k, v in PARAMETERS.items() if v is None)


@dataclass(frozen=True)
class Hardware:
    """What a trial runs on."""

    world_size: int = 2
    device: str = "cpu"                 # cpu | cuda
    max_micro_batch: int = 64           # images per rank per forward pass
    threads_per_rank: int = 1           # CPU threads of each rank
    extra: dict[str, Any] = field(default_factory=dict)


def scale_lr(lr_per_256: float, global_batch: int, rule: str) -> float:
    """Peak LR for ``global_batch`` from the LR per 256 images."""
    if rule == "linear":
        return lr_per_256 * global_batch / 256
    if rule == "sqrt":
        return lr_per_256 * math.sqrt(global_batch / 256)
    if rule == "none":
        return lr_per_256
    raise PlanError(f"unknown LR scaling rule {rule!r}; allowed: {', '.join(SCALING_RULES)}")


def split_batch(global_batch: int, world_size: int, max_micro_batch: int) -> tuple[int, int]:
    """(micro-batch, accumulation) with micro x accumulation x world = global batch.

    The accumulation is the smallest one that keeps the micro-batch within ``max_micro_batch``.
    """
    if global_batch < 1 or world_size < 1 or max_micro_batch < 1:
        raise PlanError(f"global batch ({global_batch}), world size ({world_size}) and micro-batch"
                        f" cap ({max_micro_batch}) must all be at least 1")
    if global_batch % world_size:
        raise PlanError(f"global batch {global_batch} cannot be split evenly over {world_size} "
                        f"ranks; use a multiple of {world_size}")
    per_rank = global_batch // world_size
    for accum in range(1, per_rank + 1):
        if per_rank % accum == 0 and per_rank // accum <= max_micro_batch:
            return per_rank // accum, accum
    raise PlanError(f"cannot split {per_rank} images per rank")  # unreachable: accum=per_rank


# Plan parameters that take one of a few names, with those names.
CHOICES: dict[str, tuple[str, ...]] = {"decay": tuple(DECAYS), "optimizer": OPTIMIZERS,
                                       "augment": AUGMENTATIONS,
                                       "res_mode": RESOLUTION_MODES}


SIZES = ("res_start", "res_end", "res_mid", "eval_res")   # pixels; 0: the data's own

# Numeric plan parameters the plan refuses outside an interval: name -> (what it says, test).
LIMITS: dict[str, tuple[str, Any]] = {
    "epochs": (">= 1", lambda v: int(v) >= 1),
    "warmup_epochs": (">= 0", lambda v: v >= 0),
    "label_smoothing": ("in [0, 1)", lambda v: 0 <= v < 1),
    "lr_per_256": ("> 0", lambda v: v > 0),
    "grad_clip_norm": (">= 0 (0: no clipping)", lambda v: v >= 0),
    "res_ramp_start": ("a share of the schedule, in [0, 1]", lambda v: 0 <= v <= 1),
    "res_ramp_end": ("a share of the schedule, in [0, 1]", lambda v: 0 <= v <= 1),
}


def value_problems(name: str, values: Iterable[Any]) -> list[str]:
    """What is wrong with the values a search space may give plan parameter ``name``."""
    if name in SIZES:
        return [f"{name}: {v!r} is not a size in pixels; use a whole number from {MIN_SIZE} "
                f"to {MAX_SIZE}, or 0 for the data's own" for v in values
                if v != 0 and not (isinstance(v, int | float) and float(v).is_integer()
                                   and MIN_SIZE <= v <= MAX_SIZE)]
    if name in LIMITS:
        said, ok = LIMITS[name]
        return [f"{name}: {v!r} is not a number; {name} must be {said}"
                if isinstance(v, bool) or not isinstance(v, int | float) else
                f"{name}: {v!r} is outside what the training plan takes; {name} must be {said}"
                for v in values if isinstance(v, bool) or not isinstance(v, int | float)
                or not (math.isfinite(v) and ok(v))]
    allowed = CHOICES.get(name)
    if allowed is None:
        return []
    return [f"{name}: {v!r} is not allowed; use one of {', '.join(allowed)}"
            for v in values if v not in allowed]


def name_problems(names: Iterable[str], own: Iterable[str] = ()) -> list[str]:
    """What is wrong with a search space that sets exactly ``names``, as plan parameters or
    as ``own`` parameters the study's script declares (``trainer.params``)."""
    names, own = set(names), list(own)
    found = [f"{n!r} is not a plan parameter; allowed: {', '.join(PARAMETERS)}"
             + (f", and your script's {', '.join(own)}" if own else
                " (a script of your own may take more: declare them in trainer.params)")
             for n in sorted(names - set(PARAMETERS) - set(own))]
    missing = [k for k in REQUIRED if k not in names]
    if missing:
        found.append(f"the space must set {', '.join(missing)}")
    return found


def _params(sampled: Mapping[str, Any], own: Iterable[str] = ()) -> dict[str, Any]:
    own = list(own)
    unknown = sorted(set(sampled) - set(PARAMETERS) - set(own))
    if unknown:
        raise PlanError(f"unknown plan parameter(s) {', '.join(unknown)}; "
                        f"allowed: {', '.join([*PARAMETERS, *own])}"
                        + ("" if own else " (a script of your own may take more: declare "
                           "them in trainer.params)"))
    missing = [k for k in REQUIRED if k not in sampled]
    if missing:
        raise PlanError(f"the search space must set {', '.join(missing)}")
    params = {**PARAMETERS, **sampled}
    if params["decay"] not in DECAYS:
        raise PlanError(f"unknown decay {params['decay']!r}; allowed: {', '.join(DECAYS)}")
    if params["optimizer"] not in OPTIMIZERS:
        raise PlanError(f"unknown optimizer {params['optimizer']!r}; "
                        f"allowed: {', '.join(OPTIMIZERS)}")
    if params["augment"] not in ("", *AUGMENTATIONS):
        raise PlanError(f"unknown augment {params['augment']!r}; allowed: "
                        f"{', '.join(AUGMENTATIONS)}")
    for name in ("epochs", "warmup_epochs", "label_smoothing", "lr_per_256", "grad_clip_norm"):
        for problem in value_problems(name, [params[name]]):
            raise PlanError(problem)
    _check_resolution(params)
    return params


def schedule_problems(point: Mapping[str, Any]) -> list[str]:
    """What is wrong with the image-size schedule a point (a warm start) sets."""
    try:
        _check_resolution({**PARAMETERS, **{k: v for k, v in point.items() if k in PARAMETERS}})
    except PlanError as e:
        return [str(e)]
    return []


def _check_resolution(p: Mapping[str, Any]) -> None:
    """A one-line PlanError unless the resolution parameters make a schedule."""
    if p["res_mode"] not in RESOLUTION_MODES:
        raise PlanError(f"unknown res_mode {p['res_mode']!r}; allowed: "
                        f"{', '.join(RESOLUTION_MODES)}")
    for name in ("res_start", "res_end", "res_mid", "eval_res"):
        size = p[name]
        if size != 0 and not (isinstance(size, int | float) and float(size).is_integer()
                              and MIN_SIZE <= size <= MAX_SIZE):
            raise PlanError(f"{name} {size!r} is not a size in pixels: use a whole number "
                            f"from {MIN_SIZE} to {MAX_SIZE}, or 0 for the data's own")
    start, end, mid = int(p["res_start"]), int(p["res_end"] or p["res_start"]), int(p["res_mid"])
    if not start and (p["res_end"] or mid):
        raise PlanError("res_end and res_mid need res_start: the schedule's first size")
    if start > end:
        raise PlanError(f"res_start {start} is above res_end {end}: a schedule grows the "
                        "images (train small first)")
    if mid and (p["res_mode"] != "step" or not start <= mid <= end):
        raise PlanError(f"res_mid {mid} needs res_mode 'step' and a size from res_start "
                        f"{start} to res_end {end}")
    if not 0.0 <= p["res_ramp_start"] <= p["res_ramp_end"] <= 1.0:
        raise PlanError(f"res_ramp_start {p['res_ramp_start']} and res_ramp_end "
                        f"{p['res_ramp_end']} must be shares of the schedule with "
                        "0 <= res_ramp_start <= res_ramp_end <= 1")


def _image_sizes(p: Mapping[str, Any], epochs: int, model: str) -> tuple[list[int], int]:
    """The plan's training size of each epoch ([] without a schedule) and evaluation size (0:
    the data's own)."""
    start, eval_size = int(p["res_start"]), int(p["eval_res"])
    if (start or eval_size) and model.startswith(FIXED_SIZE_MODELS):
        raise PlanError(f"model {model} takes images of one size only; remove res_start and "
                        "eval_res from the space, or use a convolutional model")
    if not start:
        return [], eval_size
    return image_sizes(epochs, start, int(p["res_end"] or start), mid=int(p["res_mid"]),
                       ramp_start=float(p["res_ramp_start"]),
                       ramp_end=float(p["res_ramp_end"]), mode=str(p["res_mode"])), eval_size


def examples_noun(data: Mapping[str, Any] | None) -> str:
    """What one training example of ``data`` (trainer.data) is called in messages."""
    return "example" if isinstance(data, Mapping) and data.get("kind") == "examples" else "image"


def too_few_to_split(train_size: int, ranks: int, noun: str = "image") -> str | None:
    """Why ``train_size`` training examples cannot be split over ``ranks`` ranks (each needs
    one a step), or None."""
    if ranks <= train_size:
        return None
    return (f"the {train_size} training {noun}s cannot give each of {ranks} ranks "
            f"{'an' if noun[0] in 'aeiou' else 'a'} {noun} a step; run on at most {train_size} "
            f"ranks (ranks_per_trial), or train on more {noun}s")


def resolve(sampled: Mapping[str, Any], *, trainer: Mapping[str, Any], train_size: int,
            hardware: Hardware, target: Mapping[str, Any], max_seconds: float,
            seed: int = 0) -> dict[str, Any]:
    """The full training plan for ``sampled`` parameters on ``hardware`` (``trainer``: the
    study file's trainer section; its ``params``, the script's own names, pass through in
    the plan's ``params``)."""
    trainer = {**_trainer_defaults(), **trainer}   # one place for the defaults: TrainerConfig
    p = _params(sampled, trainer.get("params") or ())
    batch = int(p["global_batch"])
    noun = examples_noun(trainer.get("data"))
    too_few = too_few_to_split(train_size, hardware.world_size, noun)
    if too_few:
        raise PlanError(too_few)
    micro, accum = split_batch(batch, hardware.world_size, hardware.max_micro_batch)
    if batch > train_size:
        raise PlanError(f"global batch {batch} exceeds the {train_size} training {noun}s")
    steps_per_epoch = train_size // batch
    epochs = int(p["epochs"])
    total = epochs * steps_per_epoch
    warmup = min(round(float(p["warmup_epochs"]) * steps_per_epoch), total)
    schedule = {"warmup_steps": warmup, "total_steps": total,
                "warmup_start_factor": float(p["warmup_start_factor"]), "decay": p["decay"],
                "power": float(p["decay_power"]), "milestones": [0.5, 0.75], "gamma": 0.1,
                "final_lr_factor": float(p["final_lr_factor"])}
    peak = scale_lr(float(p["lr_per_256"]), batch, str(p["lr_scaling"]))
    on_gpu = hardware.device == "cuda"
    data = dict(trainer["data"])
    sizes, eval_size = _image_sizes(p, epochs, str(trainer["model"]))
    augment = (p["augment"] or data.get("augment")
               or AUGMENT_DEFAULTS.get(str(data.get("kind", "digits")), "none"))
    return {
        "params": dict(sampled),
        "model": trainer["model"], "weights": str(trainer.get("weights") or ""),
        "num_classes": (None if trainer.get("num_classes") is None
                        else int(trainer["num_classes"])),
        "data": data, "augment": augment, "device": hardware.device,
        "threads_per_rank": hardware.threads_per_rank,
        "world_size": hardware.world_size, "global_batch": batch, "micro_batch": micro,
        "grad_accum": accum, "train_size": train_size, "steps_per_epoch": steps_per_epoch,
        "epochs": epochs, "total_steps": total, "peak_lr": peak, "schedule": schedule,
        "optimizer": {"name": p["optimizer"], "momentum": float(p["momentum"]),
                      "nesterov": bool(p["nesterov"]), "weight_decay": float(p["weight_decay"]),
                      "trust_coefficient": float(p["lars_trust_coefficient"])},
        "no_wd_on_bn_bias": bool(trainer["no_wd_on_bn_bias"]),
        "zero_init_residual": bool(trainer["zero_init_residual"]),
        "label_smoothing": float(p["label_smoothing"]),
        "image_sizes": sizes, "eval_size": eval_size,
        "target": {"metric": target["metric"], "value": float(target["value"]),
                   "mode": str(target.get("mode") or "max")},
        "eval_every_steps": int(trainer["eval_every_steps"]),
        "eval_every_s": float(trainer["eval_every_s"]),
        "eval_batch": int(trainer["eval_batch"]),
        "max_seconds": float(max_seconds), "seed": int(seed),
        "precision": str(trainer["precision"]) if on_gpu else "fp32",
        "compile": bool(trainer["compile"]),
        "serve": False, "checkpoint_dir": None, "resume_from": None, "model_path": None,
        "deepspeed": {
            "train_batch_size": batch, "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": accum, "zero_optimization": {"stage": 0},
            # DeepSpeed clips at norm 1.0 unless told otherwise; the plan says whether to.
            "gradient_clipping": float(p["grad_clip_norm"]),
            "bf16": {"enabled": on_gpu}, "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        },
    }


def _trainer_defaults() -> dict[str, Any]:
    """The study file's trainer section as it is when a file sets nothing."""
    import dataclasses

    from .config import TrainerConfig

    return dataclasses.asdict(TrainerConfig())


def derived_params(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The values a plan derives from its parameters, flat, for tracking and display."""
    sched = plan["schedule"]
    return {"world_size": plan["world_size"], "micro_batch": plan["micro_batch"],
            "grad_accum": plan["grad_accum"], "steps_per_epoch": plan["steps_per_epoch"],
            "total_steps": plan["total_steps"], "warmup_steps": sched["warmup_steps"],
            "peak_lr": plan["peak_lr"],
            "first_lr": lr_at(0, plan["peak_lr"], sched) if sched["total_steps"] else 0.0,
            "model": plan["model"], "max_seconds": plan["max_seconds"],
            "augment": plan.get("augment", "none"),
            "image_sizes": _sizes_text(plan.get("image_sizes") or [])}


def _sizes_text(sizes: list[int]) -> str:
    """A size schedule in a few words: ``128 px x 14, 224 px x 18, 288 px x 6``."""
    runs: list[list[int]] = []
    for size in sizes:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    return ", ".join(f"{size} px x {n}" for size, n in runs) or "the data's own"
