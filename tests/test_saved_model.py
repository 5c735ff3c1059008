"""The model of a trial that reached its target: saved by the real trainer on real ranks, loaded
back without DeepSpeed (``autotune.load_model``), and the slower trials' models removed."""

from __future__ import annotations

import re

import pytest
import torch
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial
from PIL import Image

import autotune
from autotune import record
from autotune.plan import Hardware, resolve
from autotune.saved_model import ImageFileError, ModelFileError

from ._drive import drive, make_plan


def _tree(root, classes=("cat", "dog", "fox"), train=40, val=12):
    """An ImageFolder tree whose classes are tinted: red, green, blue, with noise."""
    gen = torch.Generator().manual_seed(0)
    for split, n in (("train", train), ("val", val)):
        for c, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                img = torch.rand(40, 40, 3, generator=gen) * 0.5
                img[..., c] += 0.5
                Image.fromarray((img.clamp(0, 1) * 255).byte().numpy()).save(
                    folder / f"{i}.png")


def test_a_trial_that_reaches_its_target_saves_the_model_it_evaluated(tmp_path):
    _tree(tmp_path / "tree")
    data = {"kind": "imagefolder", "path": str(tmp_path / "tree"), "image_size": 32,
            "loader_workers": 0, "augment": "imagenet"}
    # a target any evaluation reaches: the trial ends at its first, and saves
    plan = resolve({"global_batch": 32, "lr_per_256": 0.1, "epochs": 2, "decay": "linear",
                    "warmup_epochs": 0.0},
                   trainer={"model": "resnet18", "data": data}, train_size=120,
                   hardware=Hardware(world_size=2),
                   target={"metric": "top1", "value": 0.01}, max_seconds=120)
    plan["model_path"] = str(tmp_path / "trial-0" / "model.pt")
    messages = drive(plan, tmp_path / "trial-0")
    end = messages[-1]
    assert end["type"] == "end" and end["reason"] == "reached"
    assert end["model_path"] == plan["model_path"]
    evaluated = [m for m in messages if m["type"] == "eval"][-1]

    saved = autotune.load_model(plan["model_path"])
    assert saved.classes == ["cat", "dog", "fox"]         # label i is the folder classes[i]
    assert saved.info["tta_s"] == end["tta_s"] and saved.info["model"] == "resnet18"
    assert saved.info["evaluation"] == {k: evaluated[k] for k in ("top1", "top5", "loss")}
    assert saved.info["params"]["global_batch"] == 32
    assert not saved.module.training
    # Each validation image, opened and prepared by the saved transform, predicted by the
    # saved weights on one process: the accuracy the trial reported at its reaching evaluation.
    paths, truth = [], []
    for name in saved.classes:
        for path in sorted((tmp_path / "tree" / "val" / name).iterdir()):
            paths.append(path)
            truth.append(name)
    predicted = saved.predict(paths)
    top1 = sum(p == t for p, t in zip(predicted, truth, strict=True)) / len(truth)
    assert evaluated["top1"] == pytest.approx(top1, abs=1e-9)
    assert saved.predict([Image.open(p) for p in paths[:4]]) == predicted[:4]  # PIL images too
    assert saved.predict(paths[5]) == predicted[5:6] == saved.predict(Image.open(paths[5]))
    assert saved.predict([]) == []
    (tmp_path / "cut.png").write_bytes(paths[0].read_bytes()[:60])
    for path, says in ((tmp_path / "cut.png", "cannot be decoded as an image ("),
                       (tmp_path / "gone.png", "is not there"), (tmp_path, "is a folder")):
        with pytest.raises(ImageFileError, match=f"^{re.escape(str(path))} {re.escape(says)}"):
            saved.predict([paths[1], path])
    # the same loss to the last digits: the same weights, BatchNorm statistics and preparation
    batch = torch.stack([saved.transform(Image.open(p).convert("RGB")) for p in paths])
    labels = torch.tensor([saved.classes.index(t) for t in truth])
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(saved.module(batch), labels).item()
    assert evaluated["loss"] == pytest.approx(loss, rel=1e-4)
    assert not list((tmp_path / "trial-0").glob(".model.pt.part"))   # written, then renamed


@pytest.mark.parametrize("content, says", [
    (None, "is not a file"),
    (b"not a model at all", "cannot be read as a saved model"),
    ("state_dict", "is not a model autotune saved"),
])
def test_a_file_autotune_did_not_save_is_refused_in_one_line(tmp_path, content, says):
    path = tmp_path / "model.pt"
    if content == "state_dict":          # what torch.save(model.state_dict()) writes
        torch.save({"fc.weight": torch.zeros(2, 2)}, path)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelFileError, match=says) as caught:
        autotune.load_model(path)
    assert "\n" not in str(caught.value) and "model.pt" in str(caught.value)


def _reached(number, tta, model=None):
    attrs = {record.OUTCOME: "reached"}
    if model:
        attrs[record.MODEL] = model
    trial = create_trial(value=tta, params={"x": 0.5},
                         distributions={"x": FloatDistribution(0, 1)}, user_attrs=attrs)
    trial.number = number
    return trial


def test_only_the_fastest_saved_model_is_kept():
    censored = create_trial(value=float("inf"), params={"x": 0.5},
                            distributions={"x": FloatDistribution(0, 1)},
                            user_attrs={record.OUTCOME: "censored"})
    trials = [_reached(0, 30.0, "/r/trial-0/model.pt"), _reached(1, 20.0, "/r/trial-1/model.pt"),
              censored, _reached(3, 25.0, "/r/trial-3/model.pt")]
    assert sorted(record.stale_models(trials)) == ["/r/trial-0/model.pt", "/r/trial-3/model.pt"]
    # a faster trial that saved no model (save_model off then, or its save failed) removes
    # nothing: the fastest model there is stays
    assert sorted(record.stale_models([*trials, _reached(4, 10.0)])) == [
        "/r/trial-0/model.pt", "/r/trial-3/model.pt"]
    assert record.stale_models([_reached(0, 30.0, "/r/trial-0/model.pt")]) == []
    failed = _reached(5, 5.0, "/r/trial-5/model.pt")
    failed.state = TrialState.FAIL
    assert record.stale_models([*trials, failed]) == record.stale_models(trials)


def test_a_model_that_cannot_be_saved_leaves_the_trials_result_as_it_is(tmp_path):
    (tmp_path / "full").write_text("a file where the model's folder would go")
    plan = make_plan(target=0.01, epochs=1)
    plan["model_path"] = str(tmp_path / "full" / "model.pt")
    messages = drive(plan, tmp_path / "trial-0")
    end = messages[-1]
    assert end["reason"] == "reached" and end["tta_s"] > 0 and "model_path" not in end
    log = (tmp_path / "trial-0" / "trainer.log").read_text()
    assert f"could not save the model to {plan['model_path']}" in log
