"""A training script of your own on data that are not images: a small MLP on scikit-learn's
bundled breast-cancer table (569 tumours, 30 measurements each, malignant or benign), tuned
for the time it takes to reach 97% validation accuracy. Run it as a study:

    autotune start study examples/own_tabular/study.yaml

The study file says ``data: {kind: examples, train_examples: 455, num_classes: 2}``: autotune
counts steps and epochs by the size the script trains on, and judges chance by the classes;
the script loads and splits the table itself, here in the usual style of a PyTorch script, a
``DataLoader`` with a ``DistributedSampler`` over a ``TensorDataset``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from trainers import api


def table() -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    """455 training and 114 validation rows, standardized by the training rows' statistics."""
    x, y = load_breast_cancer(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=114, random_state=0,
                                                      stratify=y)
    mean, std = x_train.mean(0), x_train.std(0) + 1e-8
    as_x = lambda a: torch.tensor((a - mean) / std, dtype=torch.float32)  # noqa: E731
    return (TensorDataset(as_x(x_train), torch.tensor(y_train)), as_x(x_val),
            torch.tensor(y_val))


def validation(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Validation accuracy and cross-entropy; every rank holds the whole (small) validation
    table."""
    model.eval()
    with torch.no_grad():
        logits = model(x)
        right = (logits.argmax(1) == y).float().mean().item()
        loss = F.cross_entropy(logits, y).item()
    model.train()
    return right, loss


def main() -> None:
    train, x_val, y_val = table()
    for trial in api.trials():
        plan, params = trial.plan, trial.params
        width = int(params.get("width", 64))
        model = nn.Sequential(nn.Linear(30, width), nn.ReLU(),
                              nn.Dropout(float(params.get("dropout", 0.0))), nn.Linear(width, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=trial.lr(0),
                                    momentum=plan["optimizer"]["momentum"],
                                    weight_decay=plan["optimizer"]["weight_decay"])
        trial.start()
        sampler = DistributedSampler(train, num_replicas=trial.world, rank=trial.rank,
                                     shuffle=True, seed=plan["seed"], drop_last=True)
        loader = DataLoader(train, batch_size=plan["micro_batch"] * plan["grad_accum"],
                            sampler=sampler, drop_last=True)
        ddp = DistributedDataParallel(model)
        epoch = 0
        while trial.running:
            sampler.set_epoch(epoch)
            for x, y in loader:
                for group in optimizer.param_groups:
                    group["lr"] = trial.lr()
                optimizer.zero_grad()
                loss = F.cross_entropy(ddp(x), y, label_smoothing=plan["label_smoothing"])
                loss.backward()
                optimizer.step()
                if trial.step_done(loss.item()):
                    right, val_loss = validation(model, x_val, y_val)
                    # val_loss: a target that falls (target: {metric: val_loss, mode: min})
                    trial.report(top1=right, val_loss=val_loss, loss=loss.item())
                if not trial.running:
                    break
            epoch += 1
        if trial.reached_at is not None and plan["model_path"] and trial.rank == 0:
            torch.save(model.state_dict(), plan["model_path"])   # the study keeps its best


if __name__ == "__main__":
    main()
