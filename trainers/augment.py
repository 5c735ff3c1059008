"""Training-time augmentation, by name: the same five choices for every data source.

* ``none``: the image as evaluation sees it (resized to the training size, centered);
* ``flip``: that, mirrored left-right at random (half the images);
* ``crop``: that, padded by an eighth of its side (reflected) and cropped back at a random
  offset: the object keeps its scale and moves by up to an eighth;
* ``crop_flip``: both;
* ``imagenet``: ImageNet's random-resized crop (8-100% of the area, aspect 3/4-4/3) and flip.

Mirroring is wrong for data whose classes change with it (digits, text), and ImageNet's crop
loses small images' content: which one helps a data set is for the study to find, so a search
space may search ``augment``. Evaluation never augments: ``imagenet`` is evaluated as ImageNet
is (resize to 8/7 of the size, center crop), the others on the whole image at the size.

ImageFolder trees get PIL transforms (:func:`image_transform`), run in the loader's worker
processes; in-memory tensors (the digits) are augmented a batch at a time
(:func:`augment_batch`). Both draw from torch's global generator, which checkpoints save.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["AUGMENTATIONS", "DEFAULTS", "augment_batch", "eval_transform", "image_transform"]

AUGMENTATIONS = ("none", "flip", "crop", "crop_flip", "imagenet")
# What each data source trains with when neither trainer.data nor the space says.
DEFAULTS = {"digits": "none", "imagefolder": "imagenet", "synthetic": "none"}
_MEAN, _STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def check(augment: str) -> str:
    if augment not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation {augment!r}; allowed: "
                         f"{', '.join(AUGMENTATIONS)}")
    return augment


def image_transform(augment: str, size: int) -> Any:
    """The PIL-to-tensor training transform of ``augment`` at ``size`` pixels."""
    from torchvision import transforms as T

    check(augment)
    if augment == "imagenet":
        steps = [T.RandomResizedCrop(size), T.RandomHorizontalFlip()]
    else:
        steps = [T.Resize(size), T.CenterCrop(size)]
        if augment in ("crop", "crop_flip"):
            steps.append(T.RandomCrop(size, padding=_pad(size), padding_mode="reflect"))
        if augment in ("flip", "crop_flip"):
            steps.append(T.RandomHorizontalFlip())
    return T.Compose([*steps, T.ToTensor(), T.Normalize(_MEAN, _STD)])


def eval_transform(augment: str, size: int) -> Any:
    """The evaluation transform that matches training with ``augment``."""
    from torchvision import transforms as T

    resize = round(size / 0.875) if check(augment) == "imagenet" else size
    return T.Compose([T.Resize(resize), T.CenterCrop(size), T.ToTensor(),
                      T.Normalize(_MEAN, _STD)])


def _pad(size: int) -> int:
    return max(1, size // 8)


def augment_batch(x: torch.Tensor, augment: str) -> torch.Tensor:
    """``x`` (N, C, H, W), augmented image by image as ``augment`` says (a new tensor)."""
    if check(augment) == "none" or x.shape[0] == 0:
        return x
    n, _, h, w = x.shape
    if augment == "imagenet":
        x = _resized_crops(x)
    if augment in ("crop", "crop_flip"):
        p = _pad(min(h, w))
        padded = torch.nn.functional.pad(x, (p, p, p, p), mode="reflect")
        dy = torch.randint(0, 2 * p + 1, (n,)).tolist()
        dx = torch.randint(0, 2 * p + 1, (n,)).tolist()
        x = torch.stack([padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(n)])
    if augment in ("flip", "crop_flip", "imagenet"):
        flip = torch.rand(n) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    return x


def _resized_crops(x: torch.Tensor) -> torch.Tensor:
    from torchvision.transforms import RandomResizedCrop
    from torchvision.transforms import functional as F

    h, w = x.shape[-2:]
    out = []
    for image in x:
        top, left, ch, cw = RandomResizedCrop.get_params(image, (0.08, 1.0), (3 / 4, 4 / 3))
        out.append(F.resized_crop(image, top, left, ch, cw, [h, w], antialias=True))
    return torch.stack(out)
