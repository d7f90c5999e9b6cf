"""The images the playground shows: built-in examples and uploads, as (H, W, 3) uint8 RGB arrays."""
from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..train.pathfinder import MIN_IMG_SIZE, generate_pathfinder
from ..train.reach import generate_reach, reach_params

# The shared CIFAR-10 subset lies beside the repository (/work/shared/data/README.md): found from this file, not
# from the current folder, so the page has its examples wherever it is started.
REPO = Path(__file__).resolve().parents[2]
DEFAULT_CIFAR = REPO.parent / "shared" / "data" / "cifar10-subset.npz"
CIFAR_EXAMPLES = 3  # test images of different classes
MAX_UPLOAD_BYTES = 20 << 20
# A small PNG can decode to gigabytes (12000 x 12000 px from 434 KiB): the decoded size is capped before decoding,
# and what is kept is at most KEPT_SIDE px on its longer side (the models see at most 1024 px).
MAX_UPLOAD_PIXELS = 50_000_000
KEPT_SIDE = 1024


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
        x, y, classes = read_cifar(cifar)
        for label in range(min(CIFAR_EXAMPLES, len(classes))):
            found = np.flatnonzero(y == label)
            if len(found):
                index = int(found[0])
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


def read_cifar(path: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The test images (n, H, W, 3) uint8, their labels (n,) and the class names of a CIFAR-10 subset .npz.

    Raises:
        ImageError: not a readable .npz (truncated, a folder, pickled objects), or without the arrays or shapes
            `experiments/train/datasets.py` writes; the message names the file.
    """
    fix = "give the CIFAR-10 subset .npz (x_test, y_test, classes) with --cifar, or a missing path to leave it out"
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [key for key in ("x_test", "y_test", "classes") if key not in data.files]
            if missing:
                raise ImageError(f"--cifar {path} has no {', '.join(missing)}: {fix}")
            x, y, classes = data["x_test"], data["y_test"], data["classes"]
    except ImageError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:  # truncated, object arrays, not an npz
        raise ImageError(f"--cifar {path} cannot be read ({type(error).__name__}: {str(error)[:120]}): {fix}") from None
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] != 3 or min(x.shape[1:3], default=0) < 1:
        raise ImageError(f"--cifar {path}: x_test is {x.dtype} {x.shape}, not (n, H, W, 3) uint8 images: {fix}")
    if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
        raise ImageError(f"--cifar {path}: y_test is {y.dtype} {y.shape}, not one integer label per image: {fix}")
    if classes.ndim != 1 or classes.dtype.kind not in "US":
        raise ImageError(f"--cifar {path}: classes is {classes.dtype} {classes.shape}, not a list of names: {fix}")
    return x, y, [str(c) for c in classes]


def decode_upload(data: bytes, patch_size: int) -> np.ndarray:
    """An uploaded file as an (H, W, 3) uint8 RGB image, at most `KEPT_SIDE` px on its longer side.

    Raises:
        ImageError: not an image, too large a file or too many pixels, or smaller than one patch.
    """
    if not data:
        raise ImageError("the upload is empty: choose an image file (PNG, JPEG, ...)")
    if len(data) > MAX_UPLOAD_BYTES:
        raise ImageError(f"the upload is {len(data) >> 20} MiB; give an image under {MAX_UPLOAD_BYTES >> 20} MiB")
    try:
        with Image.open(io.BytesIO(data)) as opened:
            width, height = opened.size  # from the header: nothing decoded yet
            if width * height > MAX_UPLOAD_PIXELS:
                raise ImageError(f"the image is {width} x {height} px ({width * height / 1e6:.0f} Mpx decoded); "
                                 f"give one under {MAX_UPLOAD_PIXELS / 1e6:.0f} Mpx")
            if min(width, height) < patch_size:
                raise ImageError(f"the image is {width} x {height} px, smaller than one {patch_size} x {patch_size} "
                                 f"px patch: upload an image at least {patch_size} px on each side")
            if max(width, height) > KEPT_SIDE:
                opened.draft("RGB", (KEPT_SIDE, KEPT_SIDE))  # JPEG: decode at a reduced scale where it can
                opened.thumbnail((KEPT_SIDE, KEPT_SIDE), Image.BILINEAR)
            image = np.asarray(opened.convert("RGB"))
    except ImageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as error:
        raise ImageError(f"could not read the upload as an image ({type(error).__name__}): give a PNG or "
                         "JPEG file") from None
    if min(image.shape[:2]) < 1:  # a long thin image thumbnailed to nothing
        raise ImageError(f"the image is {width} x {height} px, too thin to show: upload a squarer image")
    return image
