"""The gradient noise scale (trainers/noise.py): the two-batch-size estimator against gradients
of known variance, its pace within its budget, and a real 2-rank trial that reports it; and the
flat gradient buffer it measures in (trainers/_grads.py) against DeepSpeed's own all-reduce."""

from __future__ import annotations

import math

import pytest
import torch

from trainers.noise import NoiseScale, squared_norm


@pytest.mark.parametrize(("b", "world", "sigma"), [(8, 4, 0.1), (32, 2, 0.05), (4, 16, 0.3)])
def test_the_estimate_finds_the_known_noise_scale(b, world, sigma):
    # per-image gradients G + noise: tr(Sigma) = d sigma^2, |G|^2 = 1, so B_simple = d sigma^2
    gen = torch.Generator().manual_seed(0)
    d = 1000
    true = torch.randn(d, generator=gen)
    true /= true.norm()
    noise = NoiseScale(b, world, smoothing=0.99)
    for _ in range(400):
        images = true + sigma * torch.randn(world, b, d, generator=gen)
        per_rank = images.mean(dim=1)                   # each rank's gradient over b images
        small = float(per_rank.pow(2).sum(dim=1).mean())    # the ranks' mean |G_b|^2
        big = float(per_rank.mean(dim=0).pow(2).sum())      # the all-reduced |G_B|^2
        noise.add(small, big)
    expected = d * sigma ** 2
    assert noise.value == pytest.approx(expected, rel=0.2)


def test_one_rank_has_no_second_batch_size_and_no_estimate():
    noise = NoiseScale(64, 1)
    assert not noise.possible and not noise.due(0)
    noise.add(2.0, 1.0)
    assert noise.value is None


def test_a_noise_dominated_start_gives_no_value_until_the_signal_shows():
    noise = NoiseScale(8, 2)
    noise.add(1.0, 0.4)            # |G|^2 estimate negative: no ratio yet
    assert noise.value is None
    for _ in range(100):
        noise.add(1.0, 0.6)        # |G|^2 = (16 x 0.6 - 8) / 8 = 0.2, tr = 0.4 / (1/16) = 6.4
    assert noise.value == pytest.approx(32.0, rel=0.05)


def test_measuring_keeps_within_its_budget_of_the_step_time():
    noise = NoiseScale(8, 2, budget=0.02)
    assert noise.pace(0.001, 1.0) == 1            # 0.1% of a step: every step
    assert noise.pace(0.05, 1.0) == 3             # 5% of a step: every third step
    noise.schedule(10, 3)
    assert not noise.due(12) and noise.due(13)
    assert noise.cost_s == pytest.approx(0.051)


def test_the_squared_norm_spans_every_tensor():
    grads = [torch.full((3,), 2.0), torch.full((2, 2), 1.0)]
    assert squared_norm(grads) == pytest.approx(3 * 4 + 4)
    assert squared_norm([]) == 0.0


@pytest.mark.slow
def test_a_two_rank_trial_reports_its_image_sizes_and_noise_scale_at_each_evaluation(tmp_path):
    from ._drive import drive, make_plan

    plan = make_plan(world=2, epochs=2, res_start=16, res_end=32, res_ramp_end=0.5,
                     eval_res=32)
    assert plan["image_sizes"] == [16, 32]              # progressive resizing, 16 -> 32 px
    messages = drive(plan, tmp_path)
    evals = [m for m in messages if m["type"] == "eval"]
    # each evaluation at its epoch's size (a slow machine evaluates within epochs too)
    assert [m["image_size"] for m in evals] == [
        plan["image_sizes"][math.ceil(m["epoch"] - 1e-9) - 1] for m in evals]
    assert evals[0]["image_size"] == 16 and evals[-1]["image_size"] == 32
    scales = [m.get("noise_scale") for m in evals]
    assert all(s is not None and math.isfinite(s) and s > 0 for s in scales), scales
    end = messages[-1]
    assert end["reason"] == "planned_epochs" and end["noise_scale"] == scales[-1]
    # its cost: within a few percent of the training time (budget 2%, one step's slack)
    assert end["noise_cost_s"] < 0.05 * end["train_s"]


_RANK = '''
import json, os, sys
from pathlib import Path
import deepspeed, torch, torch.distributed as dist
from trainers import noise

deepspeed.init_distributed("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
config = {"train_batch_size": 8 * world, "train_micro_batch_size_per_gpu": 8,
          "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 0},
          "bf16": {"enabled": True}, "gradient_clipping": 0.0, "steps_per_print": 10**9,
          "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
scale = noise.NoiseScale(8, world, smoothing=0.0)   # no smoothing: this step's terms
torch.manual_seed(rank + 1)                          # each rank its own images
x, y = torch.randn(8, 16).bfloat16(), torch.randint(0, 4, (8,))
engine.enable_backward_allreduce = False             # as the trainer does on a measured step
engine.backward(torch.nn.functional.cross_entropy(engine(x).float(), y))
engine.enable_backward_allreduce = True
own = [g.float().clone() for g in noise.reduced_grads(engine)]
noise.measure(scale, lambda: noise.reduced_grads(engine), engine.allreduce_gradients)
averaged = [g.float() for g in noise.reduced_grads(engine)]
everyone = [[torch.zeros_like(g) for _ in range(world)] for g in own]
for g, slots in zip(own, everyone):
    dist.all_gather(slots, g)
mean = [sum(slots) / world for slots in everyone]
small = sum(float(g.double().pow(2).sum()) for slots in everyone for g in slots) / world
big = sum(float(g.double().pow(2).sum()) for g in averaged)   # as reduced, in bf16
b, B = 8, 8 * world
# a file per rank: the ranks' stdout lines can interleave in the launcher's
dtype = str(next(engine.module.parameters()).dtype)
Path(f"rank{rank}.json").write_text(json.dumps({"rank": rank, "dtype": dtype,
                  "averaged": all(torch.allclose(a, m, rtol=2e-2, atol=2e-3)
                                  for a, m in zip(averaged, mean)),
                  "g2": scale.g2, "g2_expected": (B * big - b * small) / (B - b),
                  "trace": scale.trace, "trace_expected": (small - big) / (1 / b - 1 / B)}))


# fp32: the trainer's flat gradient buffer against DeepSpeed's own all-reduce, three steps
def fp32_engine():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))
    config = {"train_batch_size": 4 * world, "train_micro_batch_size_per_gpu": 4,
              "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 0},
              "gradient_clipping": 0.0, "steps_per_print": 10**9}
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    return deepspeed.initialize(model=net, optimizer=opt, config=config)[0]


from trainers._grads import FlatGrads
theirs, ours = fp32_engine(), fp32_engine()
flat = FlatGrads(list(ours.module.parameters()), world, bucket_mb=0.004)   # ~1,000 floats
ours.enable_backward_allreduce = False               # as the trainer sets it
first = next(ours.module.parameters())
start = first.detach().clone()
same_grads, same_params, own_norms = [], [], []
for step in range(3):
    torch.manual_seed(100 * step + rank)             # each rank its own images, each step new
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,))
    theirs.enable_backward_allreduce = False         # DeepSpeed's path, as noise.measure
    theirs.backward(torch.nn.functional.cross_entropy(theirs(x), y))
    own_expected = noise.squared_norm(noise.reduced_grads(theirs))
    theirs.allreduce_gradients()
    flat.attach()
    if step > 0:      # buckets reduced as backward fills them, this rank's norm taken first
        flat.arm(measure=True)
    ours.backward(torch.nn.functional.cross_entropy(ours(x), y) * flat.scale)
    in_buffer = first.grad is flat.views[0]
    if step > 0:
        own = flat.finish()
        own_norms.append(abs(own - own_expected) <= 1e-5 * own_expected)
    else:             # after backward, in one go
        flat.all_reduce()
    same_grads.append(in_buffer and all(
        torch.allclose(a.grad, b.grad, rtol=1e-6, atol=1e-7)
        for a, b in zip(theirs.module.parameters(), ours.module.parameters())))
    theirs.step()
    ours.step()
    same_params.append(all(torch.allclose(a, b, rtol=1e-6, atol=1e-7)
                           for a, b in zip(theirs.module.parameters(), ours.module.parameters())))
Path(f"flat{rank}.json").write_text(json.dumps({
    "usable": FlatGrads.usable(ours), "bf16_usable": FlatGrads.usable(engine),
    "buckets": len(flat.buckets) > 1, "own": own_norms,
    "grads": same_grads, "params": same_params, "moved": not torch.allclose(first, start)}))
# Leave as the trainer does (trainers/image_classifier.py): the results are written and closed,
# and gloo's teardown at interpreter exit can abort a rank (-6, "terminate called without an
# active exception") even after destroy_process_group.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
'''


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The rank script above, launched once on 2 real ranks (gloo) through DeepSpeed's
    launcher: the folder its ranks wrote their results in."""
    import os
    import subprocess
    import sys

    from ._services import free_port
    from .conftest import ROOT

    tmp_path = tmp_path_factory.mktemp("two_ranks")
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    done = subprocess.run(
        [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2",
         "--no_local_rank", "--master_port", str(free_port()), str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return tmp_path


def test_bf16_training_measures_the_ranks_own_gradients_then_the_averaged_ones(two_ranks):
    """bf16 as on GPUs, with DeepSpeed's own bf16 optimizer on 2 real ranks (gloo): the
    measurement reads each rank's gradient before the all-reduce and the averaged one after,
    and its two terms are what the formulas give on the gathered fp32 gradients."""
    import json

    tmp_path = two_ranks
    lines = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for line in lines:
        assert line["dtype"] == "torch.bfloat16" and line["averaged"], line
        assert line["g2"] == pytest.approx(line["g2_expected"], rel=1e-3, abs=1e-6), line
        assert line["trace"] == pytest.approx(line["trace_expected"], rel=1e-3), line
        assert line["trace"] > 0, line


def test_the_flat_buffer_reduces_and_steps_as_deepspeeds_own_all_reduce(two_ranks):
    """fp32 on 2 real ranks: the trainer's flat gradient buffer (trainers/_grads.py), reduced
    in place after backward or bucket by bucket during it, holds DeepSpeed's averaged
    gradients, the engine steps to its parameters, and the rank's own squared norm taken on the
    way is the one before DeepSpeed's all-reduce; bf16 (DeepSpeed's own optimizer) keeps
    DeepSpeed's all-reduce."""
    import json

    for rank in (0, 1):
        line = json.loads((two_ranks / f"flat{rank}.json").read_text())
        assert line == {"usable": True, "bf16_usable": False, "buckets": True,
                        "own": [True] * 2, "grads": [True] * 3, "params": [True] * 3,
                        "moved": True}, line


def test_each_gradient_is_a_view_with_its_parameters_layout(tmp_path):
    """Backward's gradients land in views of one buffer with the parameters' strides; a new
    step starts afresh (no zeroing pass, yet nothing of the last step is left), and a
    parameter the step did not use is reduced as zero."""
    import torch.distributed as dist

    from trainers._grads import FlatGrads

    conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    linear = torch.nn.Linear(4, 2)
    unused = torch.nn.Linear(2, 2)
    frozen = torch.nn.Parameter(torch.ones(3), requires_grad=False)
    params = [*conv.parameters(), *linear.parameters(), *unused.parameters(), frozen]
    flat = FlatGrads(params, world=1)
    assert len(flat.params) == 6 and len(flat.buffers) == 1
    assert flat.buffers[0].numel() == sum(p.numel() for p in flat.params)

    def loss(x):
        return linear(conv(x).mean((2, 3))).square().sum()

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        for _ in range(2):   # the second step: nothing of the first is left
            x = torch.randn(2, 3, 5, 5).to(memory_format=torch.channels_last)
            flat.attach()
            assert all(p.grad is None for p in flat.params)
            flat.buffers[0].fill_(7.0)          # whatever the last step left
            flat.arm()
            loss(x).backward()
            assert flat.finish() is None
            assert [p.grad is v for p, v in zip(flat.params, flat.views, strict=True)] == \
                [True] * 6
            expected = torch.autograd.grad(loss(x), [*conv.parameters(),
                                                     *linear.parameters()])
            for p, g in zip([*conv.parameters(), *linear.parameters()], expected, strict=True):
                assert torch.allclose(p.grad, g, rtol=1e-6, atol=1e-7)
            assert all(float(p.grad.abs().sum()) == 0.0 for p in unused.parameters())
    finally:
        dist.destroy_process_group()
    assert frozen.grad is None
    assert conv.weight.grad.stride() == conv.weight.stride() != torch.empty(4, 3, 3, 3).stride()
