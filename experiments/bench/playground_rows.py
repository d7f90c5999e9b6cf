"""How long a click on the playground takes, per mixer, through the page's own API (`GET /api/rows`).

    python -m experiments.bench.playground_rows                  # every default mixer, 9 clicks each
    python -m experiments.bench.playground_rows --mixers vmamba gla --clicks 15

Per mixer, a server with that mixer alone (and the convolution panel every answer carries) runs in a thread, then
one with all of them (what the page shows); the clicks go over HTTP to it as the page sends them. The first click
on an (image, layer) computes that layer's maps ("first click"); later clicks on other patches of the same image
and layer read a row from them ("next clicks").
Prints one line per mixer with the medians in ms; the numbers depend on the machine and its load (printed too).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import urllib.request

from mixers import list_mixers

from ..playground.app import Playground, serve
from ..playground.model_set import DEFAULT_MIXERS, ModelSet
from .cli import Parser, int_at_least


def time_clicks(mixers: tuple[str, ...], clicks: int, layers: int) -> tuple[list[float], list[float]]:
    """(first-click times, next-click times) in ms for a server showing `mixers`, over `layers` layers."""
    models = ModelSet.untrained(mixers)
    playground = Playground(models, cifar=None, untrained=models)
    http = serve(playground, 0)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{http.server_address[1]}"
    tokens = models.grid[0] * models.grid[1]
    first, following = [], []
    try:
        for layer in range(min(layers, models.depth)):
            for click in range(clicks):
                patch = (click * 37 + layer * 11) % tokens
                start = time.perf_counter()
                with urllib.request.urlopen(f"{base}/api/rows?image=example-0&patch={patch}&layer={layer}",
                                            timeout=120) as response:
                    json.load(response)
                (first if click == 0 else following).append((time.perf_counter() - start) * 1e3)
    finally:
        http.shutdown()
        http.server_close()
    return first, following


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m experiments.bench.playground_rows", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mixers", nargs="+", default=list(DEFAULT_MIXERS), choices=list_mixers(), metavar="NAME")
    parser.add_argument("--clicks", type=int_at_least(2, 1000), default=9,
                        help="clicks per layer (the first computes the layer)")
    parser.add_argument("--layers", type=int_at_least(1, 64), default=2, help="layers clicked, from layer 0")
    args = parser.parse_args(argv)
    print(f"threads {os.environ.get('OMP_NUM_THREADS', 'default')}, load {os.getloadavg()[0]:.2f}")
    for mixer in [*args.mixers, "all together"]:
        shown = tuple(args.mixers) if mixer == "all together" else (mixer,)
        first, following = time_clicks(shown, args.clicks, args.layers)
        print(f"{mixer:14s} first click {statistics.median(first):8.1f} ms   next clicks "
              f"{statistics.median(following) if following else float('nan'):8.1f} ms   "
              f"(max {max(first + following):.1f} ms, {len(first) + len(following)} clicks)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
