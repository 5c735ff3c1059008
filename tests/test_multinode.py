"""A trial as 2 nodes: 2 node ranks on this machine, 1 CPU rank each, launched per node
without ssh (`--no_ssh --node_rank`), as on a cluster without ssh between nodes."""

from __future__ import annotations

import json
import time

import pytest
import torch
import torchvision

from autotune._process import ReportChannel, TrainerProcess
from autotune.errors import LaunchError
from autotune.launch import (
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



def test_an_openmpi_hostfile_reads_as_deepspeed_reads_it(tmp_path):
    # DeepSpeed's runner takes `host slots=N` and leaves what follows; autotune refused it
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("gpu-a slots=8 max_slots=8\ngpu-b slots=4\n")
    assert read_hostfile(hostfile) == [("gpu-a", 8), ("gpu-b", 4)]


@pytest.mark.parametrize("text, said", [
    ("gpu-a:8\n", "'gpu-a:8' is not 'HOST slots=N' (MPICH's form): write 'gpu-a slots=8'"),
    ("gpu-[01-04]\n", "(a Slurm node list): expand it (scontrol show hostnames)"),
    ("gpu-a\n", "'gpu-a' is not 'HOST slots=N': write 'gpu-a slots=N', N the ranks"),
    ("gpu-a slots=4\ngpu-a slots=4\n", "hostfile:2: gpu-a is listed twice; give each node "
     "one line"),
])
def test_a_hostfile_for_another_launcher_is_told_the_line_to_write(tmp_path, text, said):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(text)
    with pytest.raises(LaunchError) as e:
        read_hostfile(hostfile)
    assert said in str(e.value)


def test_a_worker_with_a_hostfile_launches_each_trial_across_its_nodes_over_ssh(tmp_path):
    from autotune.config import StudyConfig
    from autotune.space import load_space
    from autotune.trial_runner import TrialRunner

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("gpu-a slots=8\ngpu-b slots=8\n")
    cfg = StudyConfig()
    runner = TrialRunner(cfg, load_space("quickstart", world_size=2), 1437, run_dir=tmp_path,
                         hostfile=hostfile, ranks_per_node=4)
    assert runner.hardware.world_size == 8                  # 2 nodes x 4 ranks
    channel, command = runner.ranks.command(tmp_path / "plan.json")
    channel.close()
    assert command[1:3] == ["--num_gpus", "4"]
    assert command[command.index("--hostfile") + 1] == str(hostfile)
    assert command[command.index("--master_addr") + 1] == "gpu-a"
    assert command[command.index("--launcher") + 1] == "pdsh"
    assert command[command.index("--report-to") + 1] == channel.address
    assert not channel.address.startswith(("127.", "0.0.0.0"))   # reachable from gpu-a
    every_slot = TrialRunner(cfg, load_space("quickstart", world_size=2), 1437,
                             run_dir=tmp_path, hostfile=hostfile)
    assert every_slot.hardware.world_size == 16


@pytest.mark.parametrize(("args", "message"), [
    (["--hostfile", "missing"], "--hostfile missing: no such file"),
    (["--ranks-per-node", "2"], "--ranks-per-node needs --hostfile"),
    (["--hostfile", "bad", "--ranks-per-node", "1"], "is not 'HOST slots=N'"),
])
def test_worker_node_flags_are_checked_before_anything_runs(tmp_path, args, message):
    from .conftest import run_cli

    (tmp_path / "bad").write_text("gpu-a 8\n")
    result = run_cli("worker", "--storage", f"sqlite:///{tmp_path / 'x.db'}", "--study", "s",
                     *args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("autotune: error:") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.db").exists()


def test_one_node_launch_is_deepspeeds_launcher_with_the_ranks_and_port(tmp_path):
    import base64

    from autotune.launch import deepspeed_command

    command = deepspeed_command(trainer_path("image_classifier"), tmp_path / "p.json",
                                "127.0.0.1:4000", ranks=3, master_port=29511)
    # DeepSpeed's launcher, run through autotune's lifeline (trainers/_launch.py)
    assert command[1:4] == ["-u", "-m", "trainers._launch"]
    world = next(a for a in command if a.startswith("--world_info="))
    assert json.loads(base64.urlsafe_b64decode(world.partition("=")[2])) == {
        "localhost": [0, 1, 2]}
    process = TrainerProcess(["true", "--master_port=29511"], {}, tmp_path / "log")
    assert process.master_port == 29511 and process.wait() == 0
    assert TrainerProcess(["true", "--master_port", "29512"], {},
                          tmp_path / "log").master_port == 29512
