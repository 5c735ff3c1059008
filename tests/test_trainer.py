"""The trainer under the real ``deepspeed`` launcher: 2 CPU ranks over gloo, real digits."""

from __future__ import annotations

import pytest

from trainers.schedule import lr_at

from ._drive import drive, make_plan

EVAL_FIELDS = {"index", "elapsed_s", "epoch", "step", "samples", "top1", "top5", "loss", "lr",
               "images_per_s"}


def test_reports_every_epoch_and_follows_the_planned_schedule(tmp_path):
    plan = make_plan()
    messages = drive(plan, tmp_path)
    kinds = [m["type"] for m in messages]
    assert kinds == ["start", "eval", "eval", "eval", "end"]
    evals = messages[1:-1]
    for m in evals:
        assert EVAL_FIELDS <= set(m)
        assert 0.0 <= m["top1"] <= m["top5"] <= 1.0
        # The LR the optimizer used is exactly the planned one for that step.
        assert m["lr"] == pytest.approx(lr_at(m["step"], plan["peak_lr"], plan["schedule"]))
    assert [m["step"] for m in evals] == [11, 22, 33]
    assert [m["samples"] for m in evals] == [128 * 11, 128 * 22, 128 * 33]
    elapsed = [m["elapsed_s"] for m in evals]
    assert elapsed == sorted(elapsed) and elapsed[0] > 0
    end = messages[-1]
    assert end["reason"] == "planned_epochs" and end["tta_s"] is None
    assert end["steps"] == plan["total_steps"] == 33
    assert end["setup_s"] > 0 and end["train_s"] + end["eval_s"] <= end["elapsed_s"] + 0.05
    assert evals[-1]["top1"] > 0.5, "three epochs of ResNet-18 on digits should learn something"


def test_a_stop_reply_ends_the_trial_after_that_evaluation(tmp_path):
    messages = drive(make_plan(epochs=6), tmp_path,
                     lambda m: {"action": "stop" if m["type"] == "eval" else "continue",
                                "reason": "bound", "deadline_s": None})
    assert [m["type"] for m in messages] == ["start", "eval", "end"]
    assert messages[-1]["reason"] == "stopped" and messages[-1]["steps"] == 11


@pytest.mark.slow  # every study with a reached trial stops others by deadline
def test_a_deadline_stops_the_trial_between_evaluations(tmp_path):
    messages = drive(make_plan(epochs=6), tmp_path,
                     lambda m: {"action": "continue", "reason": "", "deadline_s": 0.5})
    end = messages[-1]
    assert end["reason"] == "bound"
    assert 0 < end["steps"] < 11 and end["evals"] == 0


def test_a_diverging_lr_is_reported_as_diverged(tmp_path):
    messages = drive(make_plan(lr_per_256=1e9, warmup_epochs=0.0), tmp_path)
    end = messages[-1]
    assert end["reason"] == "diverged"
    assert end["evals"] == 0 and end["steps"] < 11      # long before the first evaluation


@pytest.mark.slow  # the quickstart studies evaluate every 2 s
def test_evaluations_every_k_seconds_come_between_epoch_ends(tmp_path):
    messages = drive(make_plan({"eval_every_s": 0.5}, epochs=2), tmp_path)
    evals = [m for m in messages if m["type"] == "eval"]
    assert len(evals) >= 4                  # two epochs of about 2 s each, plus the last step
    assert any(m["step"] % 11 for m in evals)
    assert evals[-1]["step"] == 22          # the final step is always evaluated
    gaps = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(evals, evals[1:], strict=False)]
    assert min(gaps) > 0


@pytest.mark.slow  # inductor compiles the model's forward and backward: minutes on 2 cores
def test_a_compiled_model_trains_and_follows_the_plan(tmp_path):
    plan = make_plan({"compile": True}, world=1, epochs=2, warmup_epochs=0.0)
    assert plan["compile"]
    messages = drive(plan, tmp_path)
    evals = [m for m in messages if m["type"] == "eval"]
    assert [m["step"] for m in evals] == [11, 22]
    assert all(m["lr"] == pytest.approx(lr_at(m["step"], plan["peak_lr"], plan["schedule"]))
               for m in evals)
    assert messages[-1]["reason"] == "planned_epochs" and evals[-1]["top1"] > 0.5


def test_trainer_processes_start_without_mlflow():
    """The launcher's and ranks' environment hides MLflow (DeepSpeed would import it, 2 s a
    process): importing it fails with a message that says why, and DeepSpeed still loads."""
    import subprocess
    import sys

    from autotune.launch import trainer_env

    code = ("import deepspeed.autotuning.autotuner as a, sys; print(a.has_mlflow); "
            "import mlflow")
    done = subprocess.run([sys.executable, "-c", code], env=trainer_env("cpu", 1),
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "False"
    assert "MLflow is not importable in autotune's trainer processes" in done.stderr
    shown = subprocess.run([sys.executable, "-c", "import mlflow; print(mlflow.__name__)"],
                           env=trainer_env("cpu", 1, shadow_mlflow=False),
                           capture_output=True, text=True, timeout=120)
    assert shown.stdout.strip() == "mlflow"


def test_without_a_cadence_it_evaluates_within_an_epoch_to_fit_the_trial_cap(tmp_path):
    """No eval_every_s or eval_every_steps: every epoch, and inside an epoch longer than the
    cap allows, every max_seconds / 8 training seconds (here 0.5 s of a 4 s cap)."""
    plan = make_plan(global_batch=16, epochs=1)
    plan["max_seconds"] = 4.0
    messages = drive(plan, tmp_path)
    start, evals, end = messages[0], messages[1:-1], messages[-1]
    assert list(start["setup_phases"]) == ["distributed", "data", "model", "engine"]
    assert start["augment"] == "none"
    assert evals and evals[0]["epoch"] < 1.0, [m["epoch"] for m in evals]
    assert end["reason"] in ("max_seconds", "planned_epochs")


def test_models_beyond_resnet_train_under_the_launcher(tmp_path):
    """Any torchvision classification model the config accepts builds and trains: only the
    ResNet family takes zero_init_residual (passing it to every model failed every trial of
    a ShuffleNet, EfficientNet, VGG or ViT study with a TypeError)."""
    plan = make_plan({"model": "shufflenet_v2_x0_5"}, epochs=1, warmup_epochs=0.0)
    messages = drive(plan, tmp_path)
    assert [m["type"] for m in messages] == ["start", "eval", "end"]
    assert messages[-1]["reason"] == "planned_epochs"


def test_model_builders_get_what_each_model_takes():
    """The image size for the models that fix one (ViT, MaxViT), a single output for the ones
    with auxiliary heads, zero_init_residual for the ResNet family only."""
    import torch

    from trainers.models import build_model, model_kwargs

    assert model_kwargs("resnet50", 10, 32, True)["zero_init_residual"] is True
    with pytest.raises(ValueError, match="vit_b_16 has no residual blocks to zero-initialize"):
        model_kwargs("vit_b_16", 10, 32, True)
    assert model_kwargs("maxvit_t", 10, 224)["input_size"] == (224, 224)
    for name, size in (("vit_b_16", 32), ("googlenet", 64)):
        model = build_model({"model": name, "zero_init_residual": False,
                             "data": {"kind": "imagefolder", "image_size": size}}, 7).train()
        out = model(torch.randn(2, 3, size, size))
        assert isinstance(out, torch.Tensor) and out.shape == (2, 7), name
