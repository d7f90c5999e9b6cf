"""The mixer playground: click a patch of an image, see what each mixer lets that patch hear.

    python -m experiments.playground                          # untrained models, http://127.0.0.1:8777/
    python -m experiments.playground --weights results/local/reach_cpu   # a sweep run with --save-weights
    python -m experiments.playground --screenshot docs/playground.png   # the README's picture, then exit

A local web app (127.0.0.1 only): one image (built-in examples or an upload) with its patch grid; a click makes
that patch the query, and one panel per mixer shows its mixing row over the image at the chosen layer
(attention, swin and neighborhood: softmax rows per head, with or without the 1/sqrt(d) scale; linear attention:
its implicit normalised kernel matrix; mamba: the selective scan unrolled into its hidden-attention matrix, per
direction; vmamba: each of its four scans unrolled; gla: each direction's gated linear attention matrix per head;
mamba2: Hydra's quasiseparable matrix per head, whole or its forward, backward or diagonal part; any other mixer:
the gradient of the output token with respect to the input tokens), beside the fixed 3 x 3 neighbourhood of a
convolution. The maps are computed in experiments/playground/mixing.py.
"""
from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from mixers import list_mixers

from ..train.weights import WeightsError
from .images import DEFAULT_CIFAR, ImageError

DEFAULT_PORT = 8777


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit status 2, no usage dump
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _port(text: str) -> int:
    """A TCP port number, 0 to 65535 (0: a free one)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number: give 0 to 65535") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number: give 0 to 65535 (0 picks a free one)")
    return port


def build_parser() -> argparse.ArgumentParser:
    from .model_set import DEFAULT_MIXERS

    parser = _Parser(prog="python -m experiments.playground", allow_abbrev=False,
                     description=__doc__.split("\n\n")[2].replace("\n", " "),
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT, help="port on 127.0.0.1; 0 picks a free one")
    parser.add_argument("--weights", type=Path, default=None, metavar="DIR",
                        help="a sweep's --out folder holding weights/*.safetensors (written by `python -m "
                             "experiments.sweep --save-weights`); default: untrained models")
    parser.add_argument("--mixers", nargs="+", default=list(DEFAULT_MIXERS), metavar="NAME",
                        help=f"untrained models shown first; the page offers every registered mixer "
                             f"(registered: {', '.join(list_mixers())}; attention_naive "
                             "is attention's module and weights, so it is left out by default)")
    parser.add_argument("--preset", default="micro", help="backbone preset of the untrained models")
    parser.add_argument("--img-size", type=int, default=32, metavar="PX", help="image side of the untrained models")
    parser.add_argument("--patch-size", type=int, default=4, metavar="PX", help="patch side of the untrained models")
    parser.add_argument("--seed", type=int, default=0, help="initialisation seed of the untrained models")
    parser.add_argument("--cifar", type=Path, default=DEFAULT_CIFAR, metavar="NPZ",
                        help="the CIFAR-10 subset for example images (left out when the file is missing)")
    parser.add_argument("--screenshot", type=Path, default=None, metavar="PNG",
                        help="save a screenshot of the page after a click (headless chromium), then exit")
    parser.add_argument("--screenshot-patch", type=int, default=27, metavar="I",
                        help="the patch --screenshot clicks (row-major index)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from .app import Playground, serve
    from .model_set import ModelSet

    unknown = [m for m in args.mixers if m not in list_mixers()]
    if unknown:
        parser.error(f"unknown mixer(s) {', '.join(unknown)}; registered: {', '.join(list_mixers())}")
    try:
        # Every registered mixer is built (they are small), so the page can show any of them; --mixers are shown.
        offered = tuple(dict.fromkeys([*args.mixers, *list_mixers()]))
        untrained = ModelSet.untrained(offered, img_size=args.img_size, patch_size=args.patch_size,
                                       preset=args.preset, seed=args.seed)
        models = ModelSet.from_folder(args.weights) if args.weights else untrained
    except (WeightsError, ValueError) as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    tokens = models.grid[0] * models.grid[1]
    if args.screenshot and not 0 <= args.screenshot_patch < tokens:
        parser.error(f"--screenshot-patch {args.screenshot_patch} is outside the {models.grid[0]} x "
                     f"{models.grid[1]} grid: choose 0 to {tokens - 1}")
    try:
        playground = Playground(models, args.cifar, untrained, shown=tuple(args.mixers))
    except ImageError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    try:
        server = serve(playground, args.port)
    except OSError as error:
        print(f"{parser.prog}: error: cannot listen on 127.0.0.1:{args.port} ({error.strerror or error}); "
              "pass another --port (0 picks a free one)", file=sys.stderr)
        return 2
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    print(f"playground: {url} ({models.description}); Ctrl-C stops it", flush=True)
    if args.screenshot:
        return _screenshot(server, url, args, parser.prog)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _screenshot(server, url: str, args: argparse.Namespace, prog: str) -> int:
    """Serves in a thread while a headless browser clicks a patch and saves the page; then stops."""
    from .browser import BrowserUnavailable, screenshot

    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        grid = _grid(url)
        path, shown = screenshot(url, args.screenshot, args.screenshot_patch, grid, image_name=_first_cifar(url))
    except BrowserUnavailable as error:
        print(f"{prog}: error: no headless browser for --screenshot: {error}", file=sys.stderr)
        return 2
    finally:
        server.shutdown()
        server.server_close()
    print(f"screenshot: {path} (panels: {', '.join(shown)})")
    return 0


def _state(url: str) -> dict:
    import json
    from urllib.request import urlopen

    with urlopen(url + "api/state", timeout=30) as response:
        return json.load(response)


def _grid(url: str) -> tuple[int, int]:
    grid = _state(url)["grid"]
    return grid[0], grid[1]


def _first_cifar(url: str) -> str | None:
    """A natural image reads best in the screenshot: the first CIFAR example where there is one."""
    return next((image["name"] for image in _state(url)["images"] if image["name"].startswith("cifar")), None)


if __name__ == "__main__":
    sys.exit(main())
