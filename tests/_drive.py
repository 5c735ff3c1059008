"""Running the real trainer under the real launcher, answering its reports as a worker does."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.launch import (
    ReportChannel,
    TrainerProcess,
    deepspeed_command,
    free_port,
    trainer_env,
    trainer_path,
)
from autotune.plan import Hardware, resolve

Message = dict[str, Any]


def make_plan(trainer: dict[str, Any] | None = None, world: int = 2, target: float = 0.999,
              **params: Any) -> dict[str, Any]:
    sampled = {"global_batch": 128, "lr_per_256": 0.04, "epochs": 3, "decay": "linear",
               "warmup_epochs": 1.0, **params}
    trainer = {"model": "resnet18", "data": {"kind": "digits"}, **(trainer or {})}
    return resolve(sampled, trainer=trainer, train_size=1437,
                   hardware=Hardware(world_size=world),
                   target={"metric": "top1", "value": target}, max_seconds=120)


def go(msg: Message) -> Message:
    return {"action": "continue", "reason": "", "deadline_s": None}


def drive(plan: dict[str, Any], folder: Path, answer: Callable[[Message], Message] = go,
          on_message: Callable[[Message, ReportChannel, TrainerProcess], None] | None = None,
          name: str = "plan.json") -> list[Message]:
    """Runs ``plan`` on its ranks and answers each report; returns every message."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(plan))
    channel = ReportChannel()
    command = deepspeed_command(trainer_path("image_classifier"), folder / name,
                                channel.address, ranks=plan["world_size"],
                                master_port=free_port())
    process = TrainerProcess(command, trainer_env("cpu", 1), folder / f"{name}.log")
    seen = []
    for msg in channel.messages(process, time.monotonic() + 300):
        seen.append(msg)
        channel.reply({"action": "ack"} if msg["type"] == "end" else answer(msg))
        if on_message is not None:
            on_message(msg, channel, process)
    channel.close()
    assert process.wait() == 0, process.tail(20)
    return seen
