"""A training script of your own, tuned by autotune: a small CNN on scikit-learn's digits with
its own model, data loading, loss and loop, and a parameter autotune's plan does not know
(``dropout``, declared in study.yaml). Run it as a study:

    autotune start study examples/own_trainer/study.yaml

autotune launches it with DeepSpeed's launcher, one process per rank; ``trainers.api`` gives
it the plan, keeps the clock, answers the worker, stops it when it cannot win, and checkpoints
and resumes it through the two functions it hands over.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainers import api


class Net(nn.Module):
    """Two convolutions and a linear layer for 8x8 grey digits."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(64 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc(self.drop(torch.flatten(x, 1)))


def digits() -> tuple[torch.Tensor, ...]:
    """1,437 training and 360 validation images, as autotune counts the digits."""
    bunch = load_digits()
    split = train_test_split(bunch.images, bunch.target, test_size=360, random_state=0,
                             stratify=bunch.target)
    x_train, x_val, y_train, y_val = (torch.tensor(a) for a in split)
    return (x_train.float().unsqueeze(1) / 16, x_val.float().unsqueeze(1) / 16,
            y_train.long(), y_val.long())


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rank: int, world: int) -> float:
    """Top-1 over the whole validation set, each rank scoring its share."""
    model.eval()
    with torch.no_grad():
        mine = slice(rank, None, world)
        counts = torch.tensor([(model(x[mine]).argmax(1) == y[mine]).sum().item(),
                               len(y[mine])], dtype=torch.float64)
    model.train()
    dist.all_reduce(counts)
    return float(counts[0] / counts[1])


def main() -> None:
    x_train, x_val, y_train, y_val = digits()     # loaded once, kept by warm ranks
    for trial in api.trials():
        plan = trial.plan
        model = Net(trial.params.get("dropout", 0.0))
        optimizer = torch.optim.SGD(model.parameters(), lr=trial.lr(0),
                                    momentum=plan["optimizer"]["momentum"],
                                    weight_decay=plan["optimizer"]["weight_decay"])

        def save(folder, model=model, optimizer=optimizer, trial=trial):
            if trial.rank == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                           folder / "state.pt")

        def load(folder, model=model, optimizer=optimizer):
            state = torch.load(folder / "state.pt")
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])

        trial.checkpointing(save=save, load=load)
        trial.start()                              # a resumed trial loads its checkpoint here
        ddp = DistributedDataParallel(model)       # after the load: every rank starts equal
        micro, batch = plan["micro_batch"], plan["global_batch"]
        order = None
        while trial.running:
            if order is None or trial.step_in_epoch == 0:   # each epoch: a new shuffle
                order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(
                    plan["seed"] * 1000 + trial.epoch))
            start = trial.step_in_epoch * batch + trial.rank * micro * plan["grad_accum"]
            for group in optimizer.param_groups:
                group["lr"] = trial.lr()
            optimizer.zero_grad()
            for k in range(plan["grad_accum"]):
                rows = order[start + k * micro:start + (k + 1) * micro]
                loss = F.cross_entropy(ddp(x_train[rows]), y_train[rows],
                                       label_smoothing=plan["label_smoothing"])
                (loss / plan["grad_accum"]).backward()
            optimizer.step()
            if trial.step_done(loss.item()):       # an evaluation is due
                trial.report(top1=accuracy(model, x_val, y_val, trial.rank, trial.world),
                             loss=loss.item())
        if trial.reached_at is not None and plan["model_path"] and trial.rank == 0:
            torch.save(model.state_dict(), plan["model_path"])   # the study keeps its best


if __name__ == "__main__":
    main()
