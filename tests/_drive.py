"""Running the real trainer under the real launcher, answering its reports as a worker does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune._process import ReportChannel, TrainerProcess
from autotune.plan import Hardware, resolve
from autotune.ranks import keep_going, run_plan

Message = dict[str, Any]


def make_plan(trainer: dict[str, Any] | None = None, world: int = 2, target: float = 0.999,
              **params: Any) -> dict[str, Any]:
    sampled = {"global_batch": 128, "lr_per_256": 0.04, "epochs": 3, "decay": "linear",
               "warmup_epochs": 1.0, **params}
    trainer = {"model": "resnet18", "data": {"kind": "digits"}, **(trainer or {})}
    return resolve(sampled, trainer=trainer, train_size=1437,
                   hardware=Hardware(world_size=world),
                   target={"metric": "top1", "value": target}, max_seconds=120)


go = keep_going


def drive(plan: dict[str, Any], folder: Path, answer: Callable[[Message], Message] = go,
          on_message: Callable[[Message, ReportChannel, TrainerProcess], None] | None = None,
          ) -> list[Message]:
    """Runs ``plan`` on its ranks and answers each report; returns every message."""
    messages, process = run_plan(plan, folder, answer=answer, on_message=on_message,
                                 timeout_s=300)
    assert process.returncode == 0, process.tail(20)
    leaked = list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{process.master_port}_*"))
    assert not leaked, f"shared-memory buffers left behind: {leaked}"
    return messages
