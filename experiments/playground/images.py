"""The images the playground shows: built-in examples and uploads, as (H, W, 3) uint8 RGB arrays."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..train.pathfinder import MIN_IMG_SIZE, generate_pathfinder
from ..train.reach import generate_reach, reach_params

# Where the shared CIFAR-10 subset lies relative to the repository root (/work/shared/data/README.md).
DEFAULT_CIFAR = Path("../shared/data/cifar10-subset.npz")
CIFAR_EXAMPLES = 3  # test images of different classes
MAX_UPLOAD_BYTES = 20 << 20


class ImageError(ValueError):
    """An image the playground cannot show; the message says what to give instead."""


def _rgb(gray: np.ndarray) -> np.ndarray:
    return np.repeat(gray[..., None], 3, axis=2)


def example_images(img_size: int, patch_size: int, cifar: Path | None = DEFAULT_CIFAR,
                   ) -> tuple[dict[str, np.ndarray], list[str]]:
    """The built-in examples: a reach and a pathfinder image always, CIFAR-10 test images where the file is.

    Args:
        img_size: the models' image side, px (reach is drawn at it, so its marks sit inside patches).
        patch_size: the models' patch side, px.
        cifar: the CIFAR-10 subset .npz; None or a missing file leaves those examples out, with a note.

    Returns:
        (name -> image, notes on examples left out).
    """
    examples, notes = {}, []
    if cifar is not None and cifar.is_file():
        with np.load(cifar) as data:
            x, y, classes = data["x_test"], data["y_test"], [str(c) for c in data["classes"]]
            for label in range(min(CIFAR_EXAMPLES, len(classes))):
                index = int(np.flatnonzero(y == label)[0])
                examples[f"cifar10 test #{index} ({classes[label]})"] = np.ascontiguousarray(x[index])
    else:
        notes.append(f"CIFAR-10 examples left out: {cifar} not found (see /work/shared/data/README.md)")
    try:
        reach = generate_reach(reach_params(img_size, patch_size), 4, seed=0)
        examples["reach (two marks, same shape?)"] = _rgb(reach.images[int(np.argmax(reach.labels))])
    except ValueError as error:  # a patch under 3 px or a grid too small for any distance
        notes.append(f"reach example left out: {error}")
    images, _ = generate_pathfinder(2, max(img_size, MIN_IMG_SIZE), seed=0, workers=1)
    examples["pathfinder (are the two discs joined?)"] = _rgb(images[0])
    return examples, notes


def decode_upload(data: bytes, patch_size: int) -> np.ndarray:
    """An uploaded file as an (H, W, 3) uint8 RGB image, refused when no patch fits in it.

    Raises:
        ImageError: not an image, too large a file, or smaller than one patch.
    """
    if not data:
        raise ImageError("the upload is empty: choose an image file (PNG, JPEG, ...)")
    if len(data) > MAX_UPLOAD_BYTES:
        raise ImageError(f"the upload is {len(data) >> 20} MiB; give an image under {MAX_UPLOAD_BYTES >> 20} MiB")
    try:
        with Image.open(io.BytesIO(data)) as opened:
            image = np.asarray(opened.convert("RGB"))
    except (UnidentifiedImageError, OSError, ValueError) as error:
        raise ImageError(f"could not read the upload as an image ({type(error).__name__}): give a PNG or "
                         "JPEG file") from None
    h, w = image.shape[:2]
    if min(h, w) < patch_size:
        raise ImageError(f"the image is {w} x {h} px, smaller than one {patch_size} x {patch_size} px patch: "
                         f"upload an image at least {patch_size} px on each side")
    return image
