"""A trial as 2 nodes: 2 node ranks on this machine, 1 CPU rank each, launched per node
without ssh (`--no_ssh --node_rank`), as on a cluster without ssh between nodes."""

from __future__ import annotations

import json
import time

import pytest
import torch
import torchvision

from autotune.errors import LaunchError
from autotune.launch import (
    ReportChannel,
    TrainerProcess,
    free_port,
    multinode_commands,
    read_hostfile,
    trainer_env,
    trainer_path,
)
from trainers import data as digits

from ._drive import make_plan


def test_two_nodes_train_disjoint_shards_and_report_the_saved_models_accuracy(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\n")
    plan = make_plan(world=2, epochs=2)
    plan["shard_log"] = str(tmp_path / "shards")
    plan["save_model"] = str(tmp_path / "model.pt")
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    channel = ReportChannel()
    commands = multinode_commands(trainer_path("image_classifier"), tmp_path / "plan.json",
                                  channel.address, hostfile=hostfile, master_addr="127.0.0.1",
                                  master_port=free_port(), ssh=False)
    assert [c[c.index("--node_rank") + 1] for c in commands] == ["0", "1"]
    nodes = [TrainerProcess(c, trainer_env("cpu", 1), tmp_path / f"node{i}.log")
             for i, c in enumerate(commands)]
    messages = []
    for msg in channel.messages(nodes[0], time.monotonic() + 300):
        messages.append(msg)
        channel.reply({"action": "ack"} if msg["type"] == "end" else
                      {"action": "continue", "reason": "", "deadline_s": None})
    channel.close()
    assert [n.wait() for n in nodes] == [0, 0], nodes[1].tail(10)
    assert messages[0]["world_size"] == 2 and messages[-1]["reason"] == "planned_epochs"

    shards = [[json.loads(line) for line in open(f"{plan['shard_log']}.rank{r}")]
              for r in (0, 1)]
    for epoch in (0, 1):
        a, b = (set(s[epoch]["indices"]) for s in shards)
        assert len(a) == len(b) == 11 * 64 and not a & b

    # One process, no DeepSpeed: the saved model on the whole validation set.
    model = torchvision.models.resnet18(num_classes=10)
    model.load_state_dict(torch.load(plan["save_model"]))
    model.eval()
    _, val = digits.load({"kind": "digits"})
    with torch.no_grad():
        top1 = (model(val.images).argmax(1) == val.labels).sum().item() / len(val)
    last = [m for m in messages if m["type"] == "eval"][-1]
    assert last["top1"] == pytest.approx(top1, abs=1e-9)


def test_ssh_launch_is_one_pdsh_command_for_all_nodes(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# two GPU nodes\nworker-1 slots=8\nworker-2 slots=8\n")
    assert read_hostfile(hostfile) == [("worker-1", 8), ("worker-2", 8)]
    [command] = multinode_commands(trainer_path("image_classifier"), tmp_path / "p.json",
                                   "10.0.0.1:4000", hostfile=hostfile, master_addr="worker-1",
                                   master_port=29500, ssh=True)
    assert command[command.index("--launcher") + 1] == "pdsh"
    assert "--no_ssh" not in command and command[command.index("--master_addr") + 1] == "worker-1"


@pytest.mark.parametrize("text", ["worker-1\n", "worker-1 slots=0\n", "", "a slots=x\n"])
def test_a_bad_hostfile_names_the_line(tmp_path, text):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(text)
    with pytest.raises(LaunchError, match="HOST slots=N"):
        read_hostfile(hostfile)

