"""The model a winning trial saved, loaded back for use (``autotune.load_model``).

A trial that reaches the target saves its model as it was at that evaluation (the file a study
names after its best trial, ``trial-N/model.pt`` in the run folder): the weights, the
torchvision model and its arguments, the class names in label order, and how the evaluation
prepared images. ``load_model`` rebuilds the model from torchvision without DeepSpeed or a
GPU, in evaluation mode, with a transform that prepares a PIL image as the evaluation did.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import AutotuneError

__all__ = ["ImageFileError", "ModelFileError", "SavedModel", "load_model"]

PREDICT_BATCH = 64    # images prepared and predicted at a time


class ModelFileError(AutotuneError):
    """A file that is not a model autotune saved, or one it cannot rebuild."""


class ImageFileError(AutotuneError):
    """An image given to ``SavedModel.predict`` that is not there or cannot be decoded."""


@dataclass
class SavedModel:
    """``module``: the torchvision model in evaluation mode; ``classes``: the class names,
    label ``i`` being ``classes[i]``; ``transform``: PIL image to input tensor, as the
    evaluation prepared images (None for the digits and synthetic data, which are tensors
    already); ``info``: the rest of what was saved (``model``, ``params``, ``target``,
    ``tta_s``, ``evaluation``: the metrics of the evaluation that reached the target, ``data``,
    ``eval_size``, ``augment``)."""

    module: Any
    classes: list[str]
    transform: Any
    info: dict[str, Any]

    def predict(self, images: Any) -> list[str]:
        """The class name predicted for each of ``images``: image files (paths), PIL images,
        NumPy arrays as OpenCV, imageio or matplotlib give them (H x W or H x W x 3, 8-bit or
        floats in [0, 1]; OpenCV's are BGR: reverse the last axis first), or a batch tensor
        already prepared as ``transform`` prepares one (one path, image or H x W (x C) array
        alone: a list of one; an N x H x W x C array: N images). Files are opened as the
        trainer opens them and predicted ``PREDICT_BATCH`` at a time; one that is missing or
        cannot be decoded raises ``ImageFileError`` naming it, as does anything else given."""
        import math

        import numpy as np
        import torch

        from trainers.sources import EVAL_MARGIN

        if isinstance(images, torch.Tensor):
            return self._labels(images if images.dim() == 4 else images.unsqueeze(0))
        if isinstance(images, str | Path) or hasattr(images, "convert") or (
                isinstance(images, np.ndarray) and images.ndim in (2, 3)):
            images = [images]
        try:
            images = list(images)
        except TypeError:
            raise ImageFileError(_WHAT_PREDICT_TAKES.format(type(images).__name__)) from None
        if images and self.transform is None:
            raise ModelFileError(f"this model trained on {self.info['data'].get('kind')} "
                                 "data, which has no image preparation; pass a tensor")
        names: list[str] = []
        for start in range(0, len(images), PREDICT_BATCH):
            chunk = images[start:start + PREDICT_BATCH]
            least = math.ceil(EVAL_MARGIN * int(self.info.get("eval_size") or 0))
            names += self._labels(torch.stack([self.transform(_rgb(i, least)) for i in chunk]))
        return names

    def _labels(self, batch: Any) -> list[str]:
        import torch

        with torch.no_grad():
            labels = self.module(batch).argmax(dim=1).tolist()
        return [self.classes[i] for i in labels]


_WHAT_PREDICT_TAKES = ("predict takes image files (paths), PIL images, NumPy arrays (H x W or "
                       "H x W x 3) or a prepared tensor, or a list of them; got a {}")


def _rgb(image: Any, least: int = 0) -> Any:
    """An image file (path), PIL image or NumPy array in RGB, as the trainer reads it (a JPEG
    file at the reduced scale that keeps ``least`` pixels, as the evaluation decodes it)."""
    import numpy as np

    from trainers.sources import as_rgb, decode_error, open_image

    if isinstance(image, np.ndarray):
        return as_rgb(_from_array(image))
    if hasattr(image, "convert"):
        return as_rgb(image)
    if not isinstance(image, str | Path):
        raise ImageFileError(_WHAT_PREDICT_TAKES.format(type(image).__name__))
    if not Path(image).is_file():
        what = "is a folder" if Path(image).is_dir() else "is not there"
        raise ImageFileError(f"{image} {what}; give the path of an image file")
    try:
        return open_image(str(image), least)
    except Exception as e:  # noqa: BLE001 - any decoder error: the file, not the code
        raise ImageFileError(f"{image} cannot be decoded as an image ({decode_error(e)}); "
                             "give a .jpg, .png or another image file PIL reads") from None


def _from_array(array: Any) -> Any:
    """A PIL image of an H x W or H x W x C (1, 3 or 4 channels) array: 8-bit as it is,
    floats in [0, 1] (or [0, 255]) scaled to 8 bits."""
    import numpy as np
    from PIL import Image

    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in (3, 4)):
        raise ImageFileError(f"an array of shape {tuple(array.shape)} is no image; give "
                             "H x W or H x W x 3 (channels last)")
    if array.dtype != np.uint8:
        values = np.nan_to_num(array.astype(np.float64))
        scale = 255.0 if values.size and values.max() <= 1.0 else 1.0
        array = (values * scale).clip(0, 255).round().astype(np.uint8)
    return Image.fromarray(np.ascontiguousarray(array))


def load_model(path: str | Path) -> SavedModel:
    """The model saved at ``path`` by a trial that reached its target."""
    import torch

    from trainers.augment import eval_transform
    from trainers.models import MODEL_FORMAT

    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path} is not a file; give the model.pt a trial saved (`autotune "
                             "status STUDY` names the best trial's)")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickle, zip and torch each raise their own
        raise ModelFileError(f"{path} cannot be read as a saved model (torch.load: "
                             f"{type(e).__name__}); give the model.pt a trial saved") from None
    if not isinstance(saved, dict) or saved.get("format") != MODEL_FORMAT:
        raise ModelFileError(f"{path} is not a model autotune saved (no format "
                             f"{MODEL_FORMAT!r} in it); give the model.pt a trial saved")
    import torchvision

    factory = getattr(torchvision.models, str(saved["model"]), None)
    if factory is None:
        raise ModelFileError(f"{path} holds a {saved['model']} model, which this torchvision "
                             f"({torchvision.__version__}) does not have")
    module = factory(**saved["model_kwargs"])
    try:
        module.load_state_dict(saved["state_dict"])
    except RuntimeError as e:
        raise ModelFileError(f"{path}: its weights do not fit torchvision's {saved['model']} "
                             f"({str(e).splitlines()[0][:200]})") from None
    module.eval()
    data = dict(saved.get("data") or {})
    transform = (eval_transform(str(saved.get("augment") or "none"), int(saved["eval_size"]))
                 if data.get("kind") == "imagefolder" else None)
    info = {k: v for k, v in saved.items() if k not in ("state_dict", "format", "classes")}
    return SavedModel(module, list(saved["classes"]), transform, info)
