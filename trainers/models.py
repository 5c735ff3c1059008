"""The model a plan names and what runs it: a torchvision classification model; SGD, LARS or
LAMB over parameter groups (no weight decay on BatchNorm and biases when the plan says so);
DeepSpeed's engine over them with the plan's LR schedule; and the evaluation of that model on
every rank's share of the validation set."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainers.protocol import ZERO_INIT_MODELS
from trainers.schedule import lr_factor

__all__ = ["MODEL_FORMAT", "build_engine", "build_model", "build_optimizer", "evaluate",
           "fit_weights", "model_kwargs", "read_weights", "save_model", "weights_file"]

MODEL_FORMAT = "autotune-model/1"   # what a saved model file says it is (autotune.load_model)


def model_kwargs(name: str, num_classes: int, image_size: int,
                 zero_init_residual: bool = False) -> dict[str, Any]:
    """What torchvision's builder of ``name`` takes for these images: the number of classes;
    the image size for the models that fix one (ViT, MaxViT: 224 unless told); one output,
    not auxiliary ones too, for GoogLeNet and Inception v3 (their training output is a tuple);
    and zero_init_residual for the ResNet family, where the plan asks for it."""
    kwargs: dict[str, Any] = {"num_classes": num_classes}
    if zero_init_residual:
        if not name.startswith(ZERO_INIT_MODELS):
            raise ValueError(f"model {name} has no residual blocks to zero-initialize; set "
                             "trainer.zero_init_residual: false, or use a ResNet")
        kwargs["zero_init_residual"] = True
    if name.startswith("vit_"):
        kwargs["image_size"] = image_size
    elif name.startswith("maxvit_"):
        kwargs["input_size"] = (image_size, image_size)
    elif name in ("googlenet", "inception_v3"):
        kwargs["aux_logits"] = False
        kwargs["init_weights"] = True
    return kwargs


def build_model(plan: dict[str, Any], num_classes: int) -> torch.nn.Module:
    import torchvision

    from trainers.sources import image_size_of

    factory = getattr(torchvision.models, plan["model"], None)
    if factory is None:
        raise ValueError(f"unknown model {plan['model']!r}; use a torchvision model name")
    size = image_size_of(plan.get("data") or {})
    model = factory(**model_kwargs(plan["model"], num_classes, size,
                                   bool(plan["zero_init_residual"])))
    if plan.get("weights"):
        fit_weights(model, read_weights(weights_file(plan["weights"], plan["model"]),
                                        plan["model"]), plan["model"])
    return model


IMAGENET = "imagenet"    # trainer.weights: torchvision's ImageNet weights, from its cache


def weights_file(weights: str, model: str) -> Path:
    """The file ``trainer.weights`` names: a path, or for ``imagenet`` the file torchvision
    keeps ``model``'s default ImageNet weights in (``torch.hub.get_dir()/checkpoints``, as
    ``weights="DEFAULT"`` downloads them; nothing is downloaded here). A one-line ValueError
    where that file is not there, saying how to put it there."""
    if weights.lower() != IMAGENET:
        return Path(weights).expanduser()
    import torchvision

    try:
        url = torchvision.models.get_model_weights(model).DEFAULT.url
    except (ValueError, AttributeError, KeyError):
        raise ValueError(f"weights {IMAGENET}: torchvision has no ImageNet weights for "
                         f"{model}; give a file of weights") from None
    path = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(url)
    if not path.is_file():
        raise ValueError(f"weights {IMAGENET}: torchvision's {model} weights are not in its "
                         f"cache ({path}); on a machine with internet, python -c \"import "
                         f"torchvision; torchvision.models.{model}(weights='DEFAULT')\" "
                         f"downloads {path.name}: copy it there, or give its path")
    return path


def read_weights(path: str | Path, model: str | None = None) -> dict[str, torch.Tensor]:
    """The state dict in the file ``path``: a plain one (torchvision's .pth), a model.pt a
    trial saved (autotune.load_model's format; one of another model than ``model`` is told
    which), or a training checkpoint that keeps it under ``state_dict``, ``model`` or
    ``module``; its names without wrappers' prefixes. A one-line ValueError for anything
    else."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"weights {path}: no such file")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickle, zip and torch each raise their own
        raise ValueError(f"weights {path} cannot be read as a state dict (torch.load: "
                         f"{type(e).__name__}); give a file torch.save wrote a model's "
                         "state_dict() to") from None
    if isinstance(saved, dict) and saved.get("format") == MODEL_FORMAT and model is not None \
            and saved.get("model") != model:
        raise ValueError(f"weights {path} are a {saved.get('model')} model a trial saved; set "
                         f"trainer.model: {saved.get('model')}, or give weights of {model}")
    for key in ("state_dict", "model", "module"):
        if isinstance(saved, dict) and isinstance(saved.get(key), dict):
            saved = saved[key]
            break
    tensors = {_plain_name(str(k)): v for k, v in saved.items() if isinstance(v, torch.Tensor)
               } if isinstance(saved, dict) else {}
    if not tensors:
        raise ValueError(f"weights {path} hold no state dict (a {type(saved).__name__}); give "
                         "a file torch.save wrote a model's state_dict() to")
    return tensors


def fit_weights(model: torch.nn.Module, state: dict[str, torch.Tensor],
                name: str = "the model") -> list[str]:
    """Loads ``state`` into ``model``; a weight whose shape differs only in its first
    dimension (the classifier's outputs: 1,000 ImageNet classes against the data's) keeps the
    model's fresh one; a ViT's position embedding made for another image size is resampled
    to this one's patches. Returns those names; a ValueError naming what does not fit (weights of
    another architecture) loads nothing."""
    own = model.state_dict()
    key = "encoder.pos_embedding"   # a ViT's, for the image size its weights were made at
    if key in own and key in state and state[key].shape != own[key].shape \
            and hasattr(model, "image_size") and hasattr(model, "patch_size"):
        from collections import OrderedDict

        from torchvision.models.vision_transformer import interpolate_embeddings

        # resampled to this model's grid of patches, as torchvision does for other sizes
        size, patch = getattr(model, "image_size"), getattr(model, "patch_size")  # noqa: B009
        state = dict(interpolate_embeddings(int(size), int(patch), OrderedDict(state)))
    missing = [k for k in own if k not in state]
    unknown = [k for k in state if k not in own]
    fresh = [k for k in own if k in state and state[k].shape != own[k].shape]
    misfit = [k for k in fresh if state[k].dim() != own[k].dim() or state[k].dim() == 0
              or state[k].shape[1:] != own[k].shape[1:]]
    if missing or unknown or misfit:
        said = "; ".join(f"{what}: {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}"
                         for what, keys in (("missing", missing), ("not in it", unknown),
                                            ("other shapes", misfit)) if keys)
        if missing or unknown:
            todo = f"give weights of {name}"
        else:   # the same layers, other sizes: a ViT's position embedding, another width
            k = misfit[0]
            shape = "x".join(map(str, state[k].shape))
            here = "x".join(map(str, own[k].shape))
            said = f"{k} is {shape} in the file, {here} here" + (
                f"; {len(misfit) - 1} more" if len(misfit) > 1 else "")
            todo = (f"give weights of {name} built as this study builds it (a ViT's for the "
                    "study's image_size)")
        raise ValueError(f"weights do not fit {name} ({said}); {todo}")
    model.load_state_dict({k: (own[k] if k in fresh else v) for k, v in state.items()})
    return fresh


def save_model(path: str | Path, module: torch.nn.Module, plan: dict[str, Any],
               classes: list[str], **info: Any) -> None:
    """Saves ``module``'s weights and what it takes to use them again (``autotune.load_model``):
    the torchvision model and its arguments, the class names in label order, the data and the
    evaluation's image size and preparation, the plan's target and parameters, and ``info``
    (the TTA). Written to a temporary file and renamed, so a reader never sees half of it."""
    from trainers.sources import image_size_of

    data = dict(plan.get("data") or {})
    size = image_size_of(data)
    weights = {_plain_name(k): v.detach().cpu() for k, v in module.state_dict().items()}
    saved = {"format": MODEL_FORMAT, "model": plan["model"],
             "model_kwargs": model_kwargs(plan["model"], len(classes), size),
             "classes": list(classes), "data": data, "augment": plan.get("augment", "none"),
             "eval_size": int(plan.get("eval_size") or data.get("eval_size") or size),
             "target": dict(plan.get("target") or {}), "params": dict(plan.get("params") or {}),
             **info, "state_dict": weights}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.part")
    try:
        torch.save(saved, part)
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)     # a full disk: no half-written file left filling it
        raise


def _plain_name(key: str) -> str:
    """A weight's name in the plain torchvision model (torch.compile and wrappers prefix it)."""
    for prefix in ("_orig_mod.", "module."):
        while key.startswith(prefix):
            key = key[len(prefix):]
    return key


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


def build_engine(plan: dict[str, Any], num_classes: int, device: torch.device, world: int,
                 on_phase: Callable[[str], None] = lambda name: None) -> tuple[Any, Any]:
    """DeepSpeed's engine over the plan's model and optimizer, with its LR schedule; and that
    schedule (its LR is each evaluation's ``lr``). ``on_phase("engine")`` as the engine is
    set up (setup notes)."""
    import deepspeed

    model = build_model(plan, num_classes).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    optimizer = build_optimizer(model, plan)
    schedule = plan["schedule"]
    on_phase("engine")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, schedule))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                           lr_scheduler=scheduler, config=plan["deepspeed"])
    if world == 1:  # nothing to average: skip DeepSpeed's gradient all-reduce
        engine.enable_backward_allreduce = False
    if plan["compile"]:
        engine.compile()  # DeepSpeed compiles the wrapped module with torch.compile
    return engine, scheduler


def evaluate(engine: Any, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], world: int,
             device: torch.device, autocast: Callable[[], Any]) -> dict[str, float]:
    """Top-1, top-5 and mean loss over the validation set, each rank on its share
    (``batches``, on ``device``), summed over the ranks.

    Every rank first takes rank 0's buffers (BatchNorm's running statistics, which each rank
    updates from its own batches), so the ranks evaluate one model: the one rank 0 saves."""
    if world > 1:
        for buffer in engine.module.buffers():
            dist.broadcast(buffer, src=0)
    engine.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    with torch.no_grad(), autocast():
        for x, y in batches:
            logits = engine(x).float()
            top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
            sums[0] += (top5[:, 0] == y).sum()
            sums[1] += (top5 == y[:, None]).any(dim=1).sum()
            sums[2] += torch.nn.functional.cross_entropy(logits, y, reduction="sum")
            sums[3] += len(y)
    dist.all_reduce(sums)
    engine.train()
    n = sums[3].item()
    return {"top1": sums[0].item() / n, "top5": sums[1].item() / n, "loss": sums[2].item() / n}
