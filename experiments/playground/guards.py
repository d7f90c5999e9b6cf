"""What the playground's server accepts from a browser, checked before a request does anything.

The server listens on 127.0.0.1 only, but any web page the user visits can make the browser send it requests:

- DNS rebinding (a page's own name re-pointed at 127.0.0.1) reads answers unless the Host header is checked:
  only ``127.0.0.1:<port>`` and ``localhost:<port>`` are served.
- A cross-site form or ``fetch`` can POST without asking first when its content type is one of the "simple" ones
  (text/plain, form encodings); so a POST must say ``application/json`` (uploads: ``application/octet-stream``
  or ``image/*``), which a browser sends cross-site only after a CORS preflight this server never grants, and an
  ``Origin`` header, where there is one, must be the server's own.
- A ``Content-Length`` that is not a number, is negative, or is larger than any upload is refused before reading;
  one that promises more than arrives runs into the socket's read timeout (`READ_TIMEOUT_S`) instead of holding
  a thread forever.
"""
from __future__ import annotations

from email.message import Message
from http import HTTPStatus

from .images import MAX_UPLOAD_BYTES

READ_TIMEOUT_S = 10.0  # a request body that stops arriving is given up after this long
MAX_JSON_BYTES = 1 << 16  # a weights folder or a mixer list: a few hundred bytes
JSON_POSTS = ("/api/weights", "/api/models")
UPLOAD_POST = "/api/upload"


class Refused(Exception):
    """A request the server will not serve; `status` and the message go back as JSON."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def allowed_hosts(port: int) -> set[str]:
    """The Host header values that name this server."""
    return {f"127.0.0.1:{port}", f"localhost:{port}"}


def check_host(headers: Message, port: int) -> None:
    """Refuses a request whose Host header names another server (DNS rebinding)."""
    host = (headers.get("Host") or "").strip().lower()
    if host not in allowed_hosts(port):
        raise Refused(HTTPStatus.FORBIDDEN, f"host {host or '(none)'!r} is not this server: open "
                                            f"http://127.0.0.1:{port}/")


def check_post(headers: Message, path: str, port: int) -> None:
    """Refuses a POST from another origin, or of a content type a cross-site page may send without a preflight."""
    origin = headers.get("Origin")
    if origin is not None and origin.strip().lower().rstrip("/") not in {f"http://{h}" for h in allowed_hosts(port)}:
        raise Refused(HTTPStatus.FORBIDDEN, f"origin {origin!r} is not this page: use the playground's own page")
    kind = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if path == UPLOAD_POST:
        if kind != "application/octet-stream" and not kind.startswith("image/"):
            raise Refused(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"an upload is sent as application/octet-stream or "
                                                             f"image/*, not {kind or '(none)'!r}")
    elif path in JSON_POSTS and kind != "application/json":
        raise Refused(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"send application/json, not {kind or '(none)'!r}")


def content_length(headers: Message, path: str) -> int:
    """The declared body length, refused when it is not a non-negative integer or exceeds what `path` takes."""
    text = headers.get("Content-Length")
    if text is None or not text.strip():
        return 0
    try:
        length = int(text.strip())
    except ValueError:
        raise Refused(HTTPStatus.BAD_REQUEST, f"Content-Length {text!r} is not a number of bytes") from None
    if length < 0:
        raise Refused(HTTPStatus.BAD_REQUEST, f"Content-Length {length} is negative")
    limit = MAX_UPLOAD_BYTES if path == UPLOAD_POST else MAX_JSON_BYTES
    if length > limit:
        raise Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the request body is {length} bytes; at most {limit} "
                                                           "are taken here")
    return length
