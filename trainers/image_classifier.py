"""Image classification trainer, started by the ``deepspeed`` launcher.

    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 trainers/image_classifier.py --plan plan.json

The plan (JSON, written by autotune's worker) fixes everything: model, data, global batch as
micro-batch x accumulation x world size, optimizer, peak LR and schedule, label smoothing,
target, evaluation frequency and time limits. Rank 0 reports every evaluation through
:mod:`trainers.reporter` (``--report-to HOST:PORT``; without it, JSON lines on stdout).

Time accounting: the clock starts when rank 0 begins the first training step, after the process
group, model and data are ready (that setup is ``setup_s``). Evaluation time counts. Time spent
waiting for the worker's reply is not training: it is reported as ``control_s`` and left out of
``elapsed_s``. The trial's time-to-accuracy is ``elapsed_s`` at the end of the first evaluation
whose target metric reaches the target.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # started as a script by the launcher
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist

from trainers import data as datamod
from trainers.reporter import Reporter, connect
from trainers.schedule import lr_factor

# Stop codes, agreed across ranks with an all-reduce(MAX) after each optimizer step.
_GO, _DEADLINE, _MAX_SECONDS, _STOPPED, _DIVERGED = 0, 1, 2, 3, 4
_REASONS = {_DEADLINE: "bound", _MAX_SECONDS: "max_seconds", _STOPPED: "stopped",
            _DIVERGED: "diverged"}


def build_model(plan: dict[str, Any]) -> torch.nn.Module:
    import torchvision

    factory = getattr(torchvision.models, plan["model"], None)
    if factory is None:
        raise ValueError(f"unknown model {plan['model']!r}; use a torchvision model name")
    return factory(num_classes=plan["num_classes"],
                   zero_init_residual=bool(plan.get("zero_init_residual", False)))


def build_optimizer(model: torch.nn.Module, plan: dict[str, Any]) -> torch.optim.Optimizer:
    opt = plan["optimizer"]
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        skip = plan.get("no_wd_on_bn_bias", True) and (param.ndim <= 1 or name.endswith(".bias"))
        (no_decay if skip else decay).append(param)
    groups = [{"params": decay, "weight_decay": opt["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    nesterov = bool(opt.get("nesterov", False)) and opt["momentum"] > 0
    if opt["name"] == "sgd":
        return torch.optim.SGD(groups, lr=plan["peak_lr"], momentum=opt["momentum"],
                               nesterov=nesterov)
    if opt["name"] == "lars":  # timm's LARS adapts only groups with weight decay: not BN, bias
        from timm.optim import Lars

        return Lars(groups, lr=plan["peak_lr"], momentum=opt["momentum"], nesterov=nesterov,
                    trust_coeff=opt.get("trust_coefficient", 0.001))
    if opt["name"] == "lamb":
        from timm.optim import Lamb

        return Lamb(groups, lr=plan["peak_lr"], betas=(opt["momentum"], 0.999))
    raise ValueError(f"unknown optimizer {opt['name']!r}; allowed: sgd, lars, lamb")


class Clock:
    """Elapsed training time on rank 0, excluding time spent waiting for the worker."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.control_s = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.start - self.control_s


def evaluate(engine: Any, val: datamod.Split, rank: int, world: int, batch: int,
             device: torch.device) -> dict[str, float]:
    """Top-1, top-5 and mean loss over the whole validation set, sharded over the ranks."""
    engine.eval()
    sums = torch.zeros(4, dtype=torch.float64)  # correct1, correct5, loss sum, count
    with torch.no_grad():
        for idx in datamod.batches(datamod.eval_shard(len(val), rank, world), batch):
            x, y = val.images[idx].to(device), val.labels[idx].to(device)
            logits = engine(x).float()
            top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
            sums[0] += (top5[:, 0] == y).sum().item()
            sums[1] += (top5 == y[:, None]).any(dim=1).sum().item()
            sums[2] += torch.nn.functional.cross_entropy(logits, y, reduction="sum").item()
            sums[3] += len(y)
    dist.all_reduce(sums)
    engine.train()
    n = sums[3].item()
    return {"top1": sums[0].item() / n, "top5": sums[1].item() / n, "loss": sums[2].item() / n}


def _agree(*codes: int) -> list[int]:
    """The element-wise maximum of ``codes`` over all ranks: any rank can raise a flag."""
    flags = torch.tensor(codes, dtype=torch.int32)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return [int(v) for v in flags.tolist()]


def _broadcast(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.broadcast(t, src=0)
    return t.tolist()


def train(plan: dict[str, Any], reporter: Reporter) -> dict[str, Any]:
    wall0 = time.perf_counter()
    on_gpu = plan.get("device", "cpu") == "cuda"
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != plan["world_size"]:
        raise SystemExit(f"the plan is for {plan['world_size']} ranks, but {world} started")
    torch.manual_seed(plan["seed"] + rank)
    if not on_gpu:
        torch.set_num_threads(int(plan.get("threads_per_rank", 1)))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if on_gpu \
        else torch.device("cpu")

    train_set, val_set = datamod.load(plan["data"])
    model = build_model(plan).to(device)
    optimizer = build_optimizer(model, plan)
    schedule = plan["schedule"]
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, schedule))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                           lr_scheduler=scheduler, config=plan["deepspeed"])
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=plan["label_smoothing"])
    micro, accum = plan["micro_batch"], plan["grad_accum"]
    per_rank_epoch = plan["steps_per_epoch"] * micro * accum
    every_steps = int(plan.get("eval_every_steps") or 0)
    every_s = float(plan.get("eval_every_s") or 0.0)
    if not every_steps and not every_s:
        every_steps = plan["steps_per_epoch"]
    last_eval_at = 0.0
    target_metric, target = plan["target"]["metric"], plan["target"]["value"]

    deadline = None
    if rank == 0:
        reply = reporter.send({"type": "start", "setup_s": time.perf_counter() - wall0,
                               "world_size": world, "hosts": [os.uname().nodename]})
        deadline = reply.get("deadline_s")
    deadline_v = _broadcast([-1.0 if deadline is None else float(deadline)])[0]
    dist.barrier()
    setup_s = time.perf_counter() - wall0
    clock = Clock()
    train_s = eval_s = 0.0
    step = evals = 0
    since_eval_samples, since_eval_train_s = 0, 0.0
    reason, best = "planned_epochs", {"top1": 0.0, "top5": 0.0}
    reached_at = None
    stop = _GO
    for epoch in range(plan["epochs"]):
        order = datamod.epoch_shard(len(train_set), epoch, plan["seed"], rank, world,
                                    per_rank_epoch)
        for s in range(plan["steps_per_epoch"]):
            t = time.perf_counter()
            code = _GO
            for a in range(accum):
                idx = order[(s * accum + a) * micro:(s * accum + a + 1) * micro]
                x, y = train_set.images[idx].to(device), train_set.labels[idx].to(device)
                loss = criterion(engine(x), y)
                if _agree(_GO if math.isfinite(loss.item()) else _DIVERGED)[0] != _GO:
                    code = _DIVERGED  # every rank leaves before backward: no collective hangs
                    break
                engine.backward(loss)
                engine.step()
            step += 1
            due = 0
            if rank == 0 and code == _GO:
                now = clock.elapsed()
                if 0 < plan["max_seconds"] < now:
                    code = _MAX_SECONDS
                elif deadline_v > 0 and now > deadline_v:
                    code = _DEADLINE
                due = int(every_s > 0 and now - last_eval_at >= every_s)
            code, due = _agree(code, due)
            dt = time.perf_counter() - t
            train_s += dt
            since_eval_train_s += dt
            since_eval_samples += micro * accum * world
            if code != _GO:
                stop = code
                break
            if due or (every_steps and step % every_steps == 0) or step == plan["total_steps"]:
                t = time.perf_counter()
                metrics = evaluate(engine, val_set, rank, world, plan["eval_batch"], device)
                eval_s += time.perf_counter() - t
                evals += 1
                for k in ("top1", "top5"):
                    best[k] = max(best[k], metrics[k])
                decision = [0.0, deadline_v]
                if rank == 0:
                    elapsed = last_eval_at = clock.elapsed()
                    report = {"type": "eval", "index": evals - 1, "elapsed_s": elapsed,
                              "epoch": step / plan["steps_per_epoch"], "step": step,
                              "samples": step * plan["global_batch"],
                              "lr": scheduler.get_last_lr()[0],
                              "images_per_s": since_eval_samples / max(since_eval_train_s, 1e-9),
                              **metrics}
                    if metrics[target_metric] >= target:
                        reached_at = elapsed
                        report["reached"] = True
                    waited = time.perf_counter()
                    reply = reporter.send(report)
                    clock.control_s += time.perf_counter() - waited
                    decision = [1.0 if reply.get("action") == "stop" else 0.0,
                                float(reply.get("deadline_s") or -1.0)]
                    if reached_at is not None:
                        decision[0] = 2.0
                decision = _broadcast(decision)
                since_eval_samples, since_eval_train_s = 0, 0.0
                deadline_v = decision[1]
                if decision[0] == 2.0:
                    reason = "reached"
                    break
                if decision[0] == 1.0:
                    stop = _STOPPED
                    break
        if reason == "reached" or stop != _GO:
            break
    if stop != _GO:
        reason = _REASONS[stop]
    summary = {"type": "end", "reason": reason, "tta_s": reached_at, "setup_s": setup_s,
               "train_s": train_s, "eval_s": eval_s, "control_s": clock.control_s,
               "elapsed_s": clock.elapsed(), "wall_s": time.perf_counter() - wall0,
               "steps": step, "evals": evals, "best_top1": best["top1"],
               "best_top5": best["top5"]}
    if rank == 0:
        reporter.send(summary)
    dist.barrier()
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="path of the resolved plan (JSON)")
    parser.add_argument("--report-to", default=None,
                        help="HOST:PORT of the worker's report channel (default: stdout)")
    parser.add_argument("--local_rank", type=int, default=0, help="set by the launcher")
    args = parser.parse_args(argv)
    plan = json.loads(Path(args.plan).read_text())
    rank = int(os.environ.get("RANK", 0))
    reporter = connect(args.report_to) if rank == 0 else connect(None)
    try:
        train(plan, reporter)
    finally:
        reporter.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
