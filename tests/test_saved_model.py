"""The model of a trial that reached its target: saved by the real trainer on real ranks, loaded
back without DeepSpeed (``autotune.load_model``), and the slower trials' models removed."""

from __future__ import annotations

import re
from pathlib import Path

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
    # NumPy arrays as OpenCV, imageio or matplotlib give them: 8-bit, floats in [0, 1], a stack
    import numpy as np

    arrays = [np.asarray(Image.open(p).convert("RGB")) for p in paths[:4]]
    assert saved.predict(arrays) == predicted[:4] == saved.predict(np.stack(arrays))
    assert saved.predict(arrays[2]) == predicted[2:3] == saved.predict(arrays[2] / 255.0)
    for given, says in ((5, "got a int"), (np.zeros((3, 8, 8)), "shape (3, 8, 8) is no image")):
        with pytest.raises(ImageFileError, match=re.escape(says)):
            saved.predict(given)
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


@pytest.mark.slow
def test_a_model_that_cannot_be_saved_leaves_the_trials_result_as_it_is(tmp_path):
    (tmp_path / "full").write_text("a file where the model's folder would go")
    plan = make_plan(target=0.01, epochs=1)
    plan["model_path"] = str(tmp_path / "full" / "model.pt")
    messages = drive(plan, tmp_path / "trial-0")
    end = messages[-1]
    assert end["reason"] == "reached" and end["tta_s"] > 0 and "model_path" not in end
    log = (tmp_path / "trial-0" / "trainer.log").read_text()
    assert f"could not save the model to {plan['model_path']}" in log


@pytest.mark.slow    # 30 s of real ranks; how weights are fitted and found is tested below
def test_a_trial_starts_from_the_weights_a_study_names(tmp_path):
    """`trainer.weights`: the real trainer on real ranks loads a saved model's weights before
    its first step. The same plan (the quickstart's warm start on the digits) from scratch
    and from the weights of the trial that reached: the one with the weights is ahead at its
    first evaluation."""
    def plan(folder: str, weights: str = "") -> dict:
        p = make_plan({"weights": weights}, target=0.95, global_batch=128, lr_per_256=0.04,
                      epochs=8, decay="cosine", warmup_epochs=0.0)
        p["model_path"] = str(tmp_path / folder / "model.pt")
        return p

    scratch = drive(plan("scratch"), tmp_path / "scratch")
    assert scratch[-1]["reason"] == "reached", scratch[-1]
    tuned = drive(plan("tuned", weights=str(tmp_path / "scratch" / "model.pt")),
                  tmp_path / "tuned")
    first = [[m for m in run if m["type"] == "eval"][0]["top1"] for run in (scratch, tuned)]
    assert first[0] < 0.9 <= first[1], first
    assert tuned[-1]["reason"] == "reached"


def test_weights_of_another_model_or_class_count_are_fitted_or_refused(tmp_path):
    """A 1,000-class checkpoint (ImageNet's) fits a model for the data's classes with a fresh
    classifier; a checkpoint in a training wrapper's layout reads; another architecture's
    weights are refused, naming what does not fit, and load nothing."""
    import torchvision

    from trainers.models import fit_weights, read_weights

    imagenet = torchvision.models.resnet18(num_classes=1000)
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v
                                           for k, v in imagenet.state_dict().items()}},
               tmp_path / "checkpoint.pt")
    model = torchvision.models.resnet18(num_classes=3)
    head = model.fc.weight.clone()
    assert fit_weights(model, read_weights(tmp_path / "checkpoint.pt"), "resnet18") == [
        "fc.weight", "fc.bias"]
    assert torch.equal(model.conv1.weight, imagenet.conv1.weight)
    assert torch.equal(model.fc.weight, head) and model.fc.out_features == 3
    other = torchvision.models.resnet34(num_classes=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"^weights do not fit resnet18 \(not in it: "
                                         r"layer1\.2\.conv1\.weight, .*give weights of resnet18"):
        fit_weights(model, other.state_dict(), "resnet18")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    (tmp_path / "notes.pth").write_text("not weights")
    with pytest.raises(ValueError, match="cannot be read as a state dict"):
        read_weights(tmp_path / "notes.pth")


def test_vit_weights_made_at_another_image_size_have_their_position_embedding_resampled():
    """ImageNet ViT weights (224 px: 196 patches and the class token) start a ViT built for
    the study's 64 px images (16 patches): the position embedding is resampled, as
    torchvision does for other sizes; the rest loads as it is."""
    import torchvision

    from trainers.models import fit_weights

    imagenet = torchvision.models.vit_b_32(num_classes=1000)
    model = torchvision.models.vit_b_32(image_size=64, num_classes=5)
    assert fit_weights(model, imagenet.state_dict(), "vit_b_32") == [
        "heads.head.weight", "heads.head.bias"]
    assert model.encoder.pos_embedding.shape == (1, 5, 768)
    assert torch.equal(model.encoder.pos_embedding[:, :1], imagenet.encoder.pos_embedding[:, :1])
    assert torch.equal(model.conv_proj.weight, imagenet.conv_proj.weight)


def test_imagenet_weights_are_taken_from_torchvisions_cache_never_downloaded(tmp_path,
                                                                             monkeypatch):
    """`weights: imagenet` names the file torchvision keeps its default ImageNet weights in
    (a file this test writes there); where it is missing, the one line says which file and
    how to get it, and nothing is downloaded."""
    import torchvision

    from trainers.models import read_weights, weights_file

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with pytest.raises(ValueError, match=r"^weights imagenet: torchvision's resnet18 weights "
                                         r"are not in its cache \(.*/torch/hub/checkpoints/"
                                         r"resnet18-f37072fd\.pth\); on a machine with internet"):
        weights_file("imagenet", "resnet18")
    assert not (tmp_path / "torch").exists()
    cached = tmp_path / "torch" / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    cached.parent.mkdir(parents=True)
    torch.save(torchvision.models.resnet18().state_dict(), cached)
    assert weights_file("ImageNet", "resnet18") == cached
    assert set(read_weights(cached)) == set(torchvision.models.resnet18().state_dict())
    assert weights_file("~/w.pth", "resnet18") == Path.home() / "w.pth"
