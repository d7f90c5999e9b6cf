"""The playground's web server: the standard library's threading HTTP server, one static page and a JSON API.

    GET  /                    the page (page.html)
    GET  /api/state           models, weights, layers, grid, images, notes
    GET  /api/image?id=ID     the image as the models see it (PNG, S x S)
    GET  /api/rows?image=ID&patch=I&layer=L&scaled=1
                              every mixer's mixing row of patch I at layer L, and the 3 x 3 convolution's
    POST /api/upload          body: an image file -> {"id", "name"}
    POST /api/weights         body: {"folder": DIR} (or "" for untrained models) -> the new state
    POST /api/models          body: {"heads": H, "mixers": [NAME, ...]} (either) -> the new state

Every request is checked first (`guards.py`): its Host must name this server, a POST must come from this page
with a JSON (or, for an upload, binary) content type and an honest Content-Length; anything else is refused
(403, 415, 400, 413, or 408 for a body that stops arriving) before it does anything. Bad input is answered with
status 400 and {"error": message} (the page shows it), any other failure with 500 and the same shape; the server
keeps serving either way.
"""
from __future__ import annotations

import io
import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import numpy as np
from PIL import Image

from ..train.weights import WeightsError
from .guards import READ_TIMEOUT_S, Refused, check_host, check_post, content_length
from .images import ImageError, decode_upload, example_images
from .mixing import conv_row
from .model_set import ModelSet

PAGE = Path(__file__).with_name("page.html")
MAX_UPLOADS = 4  # uploads kept in memory (each at most 1024 px a side, 3 MiB); the oldest go first


class BadRequest(ValueError):
    """A request the page can fix; its message is shown there."""


class Playground:
    """What the server shows: a model set and the images; every method returns JSON-ready data.

    Args:
        models: the models on show.
        cifar: the CIFAR-10 subset for the examples (None: none).
        untrained: the untrained model set, for a weights request with an empty folder.
        shown: the untrained mixers shown first (default: all); the page can show the others.
    """

    def __init__(self, models: ModelSet, cifar: Path | None, untrained: ModelSet | None = None,
                 shown: tuple[str, ...] | None = None) -> None:
        self.lock = threading.Lock()  # one computation at a time: the models are shared by the handler threads
        self.cifar = cifar
        self.untrained = untrained or models
        self.untrained_shown = list(shown) if shown is not None else list(self.untrained.models)
        self.uploads: dict[str, tuple[str, np.ndarray]] = {}
        self.upload_count = 0  # ids stay unique after the oldest uploads are dropped
        self.shown: list[str] = []
        self._use(models, self.untrained_shown if models is self.untrained else None)

    def _use(self, models: ModelSet, shown: Iterable[str] | None = None) -> None:
        examples, notes = example_images(models.img_size, models.patch_size, self.cifar)
        self.models = models
        self.shown = [m for m in (models.models if shown is None else shown) if m in models.models]
        self.example_notes = notes
        self.examples = {f"example-{i}": (name, image) for i, (name, image) in enumerate(examples.items())}

    def images(self) -> dict[str, tuple[str, np.ndarray]]:
        return {**self.examples, **self.uploads}

    def state(self) -> dict:
        m = self.models
        return {
            "description": m.description,
            "weights": {mixer: m.labels[mixer] for mixer in self.shown},
            "mixers": list(self.shown),
            "available": list(m.models),
            "heads": m.heads,
            "heads_options": m.heads_options,
            "layers": m.depth,
            "grid": list(m.grid),
            "img_size": m.img_size,
            "patch_size": m.patch_size,
            "images": [{"id": key, "name": name} for key, (name, _) in self.images().items()],
            "notes": [*m.notes, *self.example_notes],
        }

    def choose(self, heads: object = None, mixers: object = None) -> dict:
        """Shows other mixers of the set, or the untrained models built with another number of heads."""
        if mixers is not None:
            if not isinstance(mixers, list) or not all(isinstance(m, str) for m in mixers):
                raise BadRequest("mixers must be a list of mixer names")
            unknown = [m for m in mixers if m not in self.models.models]
            if unknown:
                raise BadRequest(f"no model for {', '.join(unknown)}: choose among {', '.join(self.models.models)}")
        if heads is not None:
            if isinstance(heads, bool) or not isinstance(heads, int):
                raise BadRequest(f"heads must be an integer, got {heads!r}")
            models = self.models.with_heads(heads)
            if models is not self.models:
                if self.models is self.untrained:
                    self.untrained = models  # Load with an empty folder comes back to these heads
                self.models = models
        self.shown = [m for m in self.models.models if m in (self.shown if mixers is None else mixers)]
        if self.untrained is self.models:
            self.untrained_shown = list(self.shown)
        return self.state()

    def image_png(self, image_id: str) -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(self.models.resize(self._image(image_id))).save(buffer, format="PNG")
        return buffer.getvalue()

    def _image(self, image_id: str) -> np.ndarray:
        try:
            return self.images()[image_id][1]
        except KeyError:
            raise BadRequest(f"no image {image_id!r}: choose an example or upload one") from None

    def rows(self, image_id: str, patch: int, layer: int, scaled: bool) -> dict:
        m = self.models
        grid = m.grid
        if not 0 <= patch < grid[0] * grid[1]:
            raise BadRequest(f"patch {patch} is outside the {grid[0]} x {grid[1]} grid")
        if not 0 <= layer < m.depth:
            raise BadRequest(f"layer {layer} does not exist: choose 0 to {m.depth - 1}")
        shown = m.rows(self._image(image_id), patch, layer, scaled=scaled, image_key=image_id, mixers=self.shown)
        panels = []
        for mixer, rows in shown.items():
            mixer_module = m.models[mixer].blocks[layer].mixer
            panels.append({
                "mixer": mixer, "family": rows.family, "maps": rows.rows.tolist(), "map_names": list(rows.map_names),
                "note": rows.note, "weights": m.labels[mixer], "heads": rows.heads,
                "views": list(rows.view_names),
                "window_size": getattr(mixer_module, "window_size", None),
                "shift": getattr(mixer_module, "shift", None),
            })
        panels.append({"mixer": "conv 3x3", "family": "conv", "maps": [conv_row(grid, patch).tolist()],
                       "map_names": ["3 x 3 kernel"], "weights": "fixed",
                       "heads": 1, "views": [""],
                       "note": "what a 3 x 3 convolution over the patch grid reads: the same neighbourhood everywhere"})
        return {"image": image_id, "patch": patch, "layer": layer, "scaled": scaled, "grid": list(grid),
                "panels": panels}

    def upload(self, data: bytes, name: str) -> dict:
        image = decode_upload(data, self.models.patch_size)
        self.upload_count += 1
        key = f"upload-{self.upload_count}"
        while len(self.uploads) >= MAX_UPLOADS:
            self.uploads.pop(next(iter(self.uploads)))
        self.uploads[key] = (f"upload: {name or 'image'} ({image.shape[1]} x {image.shape[0]} px)", image)
        return {"id": key, "name": self.uploads[key][0]}

    def load_weights(self, folder: str) -> dict:
        if folder.strip():
            self._use(ModelSet.from_folder(Path(folder)))
        else:
            self._use(self.untrained, self.untrained_shown)
        return self.state()


def make_handler(playground: Playground) -> type[BaseHTTPRequestHandler]:
    """A request handler class bound to `playground`."""

    class Handler(BaseHTTPRequestHandler):
        timeout = READ_TIMEOUT_S  # the socket's timeout: a body that stops arriving frees the thread
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            pass  # the terminal shows the address and errors, not every request

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, payload: dict) -> None:
            self._send(status, json.dumps(payload).encode(), "application/json")

        def _answer(self, work) -> None:
            try:
                with playground.lock:
                    result = work()
                # allow_nan=False: a NaN would make the answer invalid JSON; it fails here, as a 500 the page shows
                body = result if isinstance(result, bytes) else json.dumps(result, allow_nan=False).encode()
            except (BadRequest, ImageError, WeightsError, ValueError) as error:
                self._json(HTTPStatus.BAD_REQUEST, {"error": str(error)})
                return
            except Exception as error:  # noqa: BLE001 - one failed request must not stop the server
                self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {type(error).__name__}: "
                                                                        f"{error}"})
                return
            self._send(HTTPStatus.OK, body, "image/png" if isinstance(result, bytes) else "application/json")

        def _guard(self, post: bool) -> int | None:
            """Checks the request's headers (`guards.py`); the body length to read, or None once refused."""
            path = urlparse(self.path).path
            try:
                check_host(self.headers, self.server.server_address[1])
                if not post:
                    return 0
                check_post(self.headers, path, self.server.server_address[1])
                return content_length(self.headers, path)
            except Refused as refused:
                self.close_connection = True  # an unread body must not be taken for the next request
                self._json(refused.status, {"error": str(refused)})
                return None

        def do_GET(self) -> None:  # noqa: N802 - the base class's name
            if self._guard(post=False) is None:
                return
            url = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if url.path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, PAGE.read_bytes(), "text/html; charset=utf-8")
            elif url.path == "/api/state":
                self._answer(playground.state)
            elif url.path == "/api/image":
                self._answer(lambda: playground.image_png(query.get("id", "")))
            elif url.path == "/api/rows":
                self._answer(lambda: playground.rows(query.get("image", ""), _int(query, "patch"),
                                                     _int(query, "layer", 0), query.get("scaled", "1") != "0"))
            else:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no page {url.path}"})

        def do_POST(self) -> None:  # noqa: N802 - the base class's name
            length = self._guard(post=True)
            if length is None:
                return
            url = urlparse(self.path)
            try:
                body = self.rfile.read(length)
            except TimeoutError:  # the Content-Length promised more than arrived
                self.close_connection = True
                self._json(HTTPStatus.REQUEST_TIMEOUT, {"error": f"the request body stopped arriving before the "
                                                                 f"{length} bytes its Content-Length promised"})
                return
            if len(body) < length:  # the client closed its side early
                self.close_connection = True
                self._json(HTTPStatus.BAD_REQUEST, {"error": f"the request body has {len(body)} of the {length} "
                                                             "bytes its Content-Length promised"})
                return
            if url.path == "/api/upload":
                name = parse_qs(url.query).get("name", [""])[-1]
                self._answer(lambda: playground.upload(body, name))
            elif url.path == "/api/weights":
                self._answer(lambda: playground.load_weights(str(_json_body(body).get("folder", ""))))
            elif url.path == "/api/models":
                self._answer(lambda: playground.choose(**{k: v for k, v in _json_body(body).items()
                                                          if k in ("heads", "mixers")}))
            else:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no page {url.path}"})

    return Handler


def _int(query: dict[str, str], name: str, default: int | None = None) -> int:
    value = query.get(name)
    if value is None and default is not None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise BadRequest(f"{name} must be an integer, got {value!r}") from None


def _json_body(body: bytes) -> dict:
    try:
        value = json.loads(body or b"{}")
    except json.JSONDecodeError as error:
        raise BadRequest(f"the request body is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise BadRequest("the request body must be a JSON object")
    return value


def serve(playground: Playground, port: int) -> ThreadingHTTPServer:
    """A server bound to 127.0.0.1:`port` (0: a free port), not yet serving; raises OSError if it cannot bind."""
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(playground))
    server.daemon_threads = True
    return server
