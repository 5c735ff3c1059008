"""The model and optimizer a plan names: a torchvision classification model, and SGD, LARS
or LAMB over parameter groups (no weight decay on BatchNorm and biases when the plan says so)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["build_model", "build_optimizer"]


def build_model(plan: dict[str, Any], num_classes: int) -> torch.nn.Module:
    import torchvision

    factory = getattr(torchvision.models, plan["model"], None)
    if factory is None:
        raise ValueError(f"unknown model {plan['model']!r}; use a torchvision model name")
    return factory(num_classes=num_classes,
                   zero_init_residual=bool(plan["zero_init_residual"]))


def build_optimizer(model: torch.nn.Module, plan: dict[str, Any]) -> torch.optim.Optimizer:
    opt = plan["optimizer"]
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, param in model.named_parameters():
        skip = plan["no_wd_on_bn_bias"] and (param.ndim <= 1 or name.endswith(".bias"))
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
