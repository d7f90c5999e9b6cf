"""The playground's server, CLI and weights, without a browser: answers, bad input, saved weights loaded back."""
from __future__ import annotations

import contextlib
import io
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from PIL import Image

from experiments.measure.point import Point
from experiments.measure.run import build_model, train_point
from experiments.playground.app import Playground, serve
from experiments.playground.model_set import ModelSet
from experiments.playground.__main__ import main as playground_main
from experiments.sweep.__main__ import main as sweep_main, with_weights_paths
from experiments.sweep.config import ConfigError, _digest
from experiments.train.weights import WeightsError, read_weights, save_weights
from tiny_sweep import tiny_config, write_config

MIXERS = ("attention", "swin", "linear", "mamba")


@pytest.fixture(scope="module")
def untrained() -> ModelSet:
    return ModelSet.untrained(MIXERS, img_size=16, patch_size=4, preset="micro")


@pytest.fixture()
def server(untrained: ModelSet):
    """The app's server in a thread, on a free port; yields a function that calls its API."""
    http = serve(Playground(untrained, cifar=None, untrained=untrained), 0)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{http.server_address[1]}"

    def call(path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
             ) -> tuple[int, dict | bytes]:
        kind = "application/octet-stream" if path.startswith("/api/upload") else "application/json"
        headers = {**({"Content-Type": kind} if body is not None else {}), **(headers or {})}
        request = urllib.request.Request(base + path, data=body, method="POST" if body is not None else "GET",
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, payload, kind = response.status, response.read(), response.headers["Content-Type"]
        except urllib.error.HTTPError as error:
            status, payload, kind = error.code, error.read(), error.headers["Content-Type"]
        return status, json.loads(payload) if kind == "application/json" else payload

    yield call
    http.shutdown()
    http.server_close()


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 40, 40)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_rows_answer_one_panel_per_mixer_and_the_convolution(server) -> None:
    status, state = server("/api/state")
    assert status == 200 and state["grid"] == [4, 4] and state["mixers"] == list(MIXERS)
    assert any("CIFAR-10 examples left out" in note for note in state["notes"])  # cifar=None: said, not hidden
    image = state["images"][0]["id"]
    status, picture = server(f"/api/image?id={image}")
    assert status == 200 and Image.open(io.BytesIO(picture)).size == (16, 16)
    status, rows = server(f"/api/rows?image={image}&patch=5&layer=1&scaled=0")
    assert status == 200
    panels = {p["mixer"]: p for p in rows["panels"]}
    assert list(panels) == [*MIXERS, "conv 3x3"]
    assert all(len(row) == 16 for p in panels.values() for row in p["maps"])
    assert len(panels["attention"]["maps"]) == 2 and "scale removed" in panels["attention"]["note"]
    assert panels["swin"]["shift"] == 2  # layer 1 shifts its windows


@pytest.mark.parametrize("request_path, body, message", [
    ("/api/rows?image=example-0&patch=16", None, "patch 16 is outside the 4 x 4 grid"),
    ("/api/rows?image=example-0&patch=0&layer=9", None, "layer 9 does not exist: choose 0 to 3"),
    ("/api/rows?image=nope&patch=0", None, "no image 'nope'"),
    ("/api/rows?image=example-0&patch=x", None, "patch must be an integer"),
    ("/api/upload?name=small.png", png(3, 8), "the image is 3 x 8 px, smaller than one 4 x 4 px patch"),
    ("/api/upload?name=notes.txt", b"hello", "could not read the upload as an image"),
    ("/api/weights", b'{"folder": "/nonexistent/sweep"}', "no folder /nonexistent/sweep"),
    ("/api/weights", b"not json", "the request body is not JSON"),
])
def test_bad_input_gets_a_message_and_the_server_keeps_serving(server, tmp_path: Path, request_path: str,
                                                               body: bytes | None, message: str) -> None:
    status, answer = server(request_path, body)
    assert status == 400 and message in answer["error"]
    status, _ = server("/api/rows?image=example-0&patch=0")
    assert status == 200


def test_a_folder_without_weights_is_named_in_the_message(server, tmp_path: Path) -> None:
    status, answer = server("/api/weights", json.dumps({"folder": str(tmp_path)}).encode())
    assert status == 400 and f"no weights in {tmp_path}" in answer["error"] and "--save-weights" in answer["error"]


def test_an_upload_becomes_an_image_to_click(server) -> None:
    status, added = server("/api/upload?name=red.png", png(40, 24))
    assert status == 200 and added["name"] == "upload: red.png (40 x 24 px)"
    status, rows = server(f"/api/rows?image={added['id']}&patch=3")
    assert status == 200 and len(rows["panels"]) == len(MIXERS) + 1


@pytest.mark.parametrize("argv, message", [
    (["--weights", "/nonexistent/sweep"], "no folder /nonexistent/sweep"),
    (["--img-size", "30"], "patch_size 4 does not divide img_size 30"),
    (["--mixers", "atention"], "unknown mixer(s) atention"),
])
def test_cli_bad_input_is_one_line_and_exit_status_2(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) if argv[0] == "--mixers" else contextlib.nullcontext() as stopped:
        status = playground_main(["--port", "0", *argv])
    status = stopped.value.code if argv[0] == "--mixers" else status
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


def test_a_trained_point_saves_weights_the_playground_loads(tmp_path: Path) -> None:
    path = tmp_path / "sweep" / "weights" / "abc.safetensors"
    point = Point(mixer="swin", preset="micro", img_size=16, patch_size=4, batch_size=1, dataset="reach", epochs=1,
                  overrides='{"depth":2,"mixer_options":{"window_size":2}}',
                  train='{"batch_size":16,"train_samples":32}', weights_path=str(path))
    train_point(point, torch.device("cpu"), torch.float32)
    saved = read_weights(path)
    assert saved.key["mixer"] == "swin" and saved.in_chans == 1 and saved.num_classes == 2
    models = ModelSet.from_folder(tmp_path / "sweep")
    assert list(models.models) == ["swin"] and models.in_chans == 1 and models.grid == (4, 4)
    assert "abc.safetensors: swin micro trained on reach 16px/p4" in models.labels["swin"]
    rows = models.rows(torch.zeros(16, 16, 3, dtype=torch.uint8).numpy(), 0, 1)["swin"]
    assert rows.family == "swin" and (rows.rows[:, 15] == 0).all()  # token 15 is in another window


def test_weights_that_do_not_fit_their_header_are_refused_by_name(tmp_path: Path) -> None:
    point = Point(mixer="linear", preset="micro", img_size=16, patch_size=4, batch_size=1, overrides='{"depth":1}')
    model = build_model(point, num_classes=2, in_chans=1)
    key = {"mixer": "linear", "preset": "micro", "img_size": 16, "patch_size": 4, "overrides": '{"depth":2}'}
    save_weights(tmp_path / "weights" / "x.safetensors", model, key, num_classes=2, in_chans=1, mean=(0.5,),
                 std=(0.5,))
    with pytest.raises(WeightsError, match="x.safetensors: does not fit the model its header names"):
        ModelSet.from_folder(tmp_path)


def test_a_pickle_is_never_loaded(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    torch.save({"a": torch.zeros(1)}, tmp_path / "weights" / "evil.safetensors")
    with pytest.raises(WeightsError, match="not a readable safetensors file"):
        ModelSet.from_folder(tmp_path)


def test_save_weights_names_files_by_the_key_hash_of_training_points_only(tmp_path: Path) -> None:
    training = Point(mixer="linear", preset="micro", img_size=16, patch_size=4, batch_size=1, epochs=1,
                     dataset="reach")
    cost_only = Point(mixer="linear", preset="micro", img_size=16, patch_size=4, batch_size=1)
    trained, measured = with_weights_paths([training, cost_only], tmp_path)
    assert Path(trained.weights_path) == tmp_path / "weights" / f"{_digest(training.key)}.safetensors"
    assert measured.weights_path == ""
    with pytest.raises(ConfigError, match="--save-weights saves trained weights, but this sweep trains nothing"):
        with_weights_paths([cost_only], tmp_path)


def test_sweep_refuses_save_weights_without_training_in_one_line(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path, tiny_config(["linear"], [16]))
    status = sweep_main(["--config", str(config), "--out", str(tmp_path / "out"), "--save-weights"])
    out, err = capsys.readouterr()
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "--save-weights saves trained weights" in err and not (tmp_path / "out").exists()


# --- Hostile input (issue 35, section 2) ------------------------------------------------------------------------


def raw_request(server_port: int, method: str, path: str, headers: dict[str, str], body: bytes = b"",
                timeout: float = 30) -> tuple[int, dict]:
    """One request with exactly these headers (urllib would fill in Host and Content-Length itself)."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", server_port, timeout=timeout)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders(body or None)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


@pytest.fixture()
def http_server(untrained: ModelSet):
    """(server, port): the app's server in a thread, for requests with hand-made headers."""
    http = serve(Playground(untrained, cifar=None, untrained=untrained), 0)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    yield http, http.server_address[1]
    http.shutdown()
    http.server_close()


def test_a_foreign_host_cannot_read_the_state(http_server) -> None:
    _, port = http_server
    status, answer = raw_request(port, "GET", "/api/state", {"Host": "attacker.example"})
    assert status == 403 and "is not this server" in answer["error"]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        assert raw_request(port, "GET", "/api/state", {"Host": host})[0] == 200


@pytest.mark.parametrize("headers, status, message", [
    ({"Origin": "http://evil.example", "Host": "evil.example", "Content-Type": "text/plain"}, 403, "not this server"),
    ({"Origin": "http://evil.example", "Content-Type": "application/json"}, 403, "is not this page"),
    ({"Content-Type": "text/plain"}, 415, "send application/json"),
    ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "send application/json"),
])
def test_a_cross_site_post_cannot_switch_the_models(http_server, headers: dict, status: int, message: str) -> None:
    _, port = http_server
    body = json.dumps({"heads": 1}).encode()
    sent = {"Host": f"127.0.0.1:{port}", "Content-Length": str(len(body)), **headers}
    answer_status, answer = raw_request(port, "POST", "/api/models", sent, body)
    assert answer_status == status and message in answer["error"]
    _, state = raw_request(port, "GET", "/api/state", {"Host": f"127.0.0.1:{port}"})
    assert state["heads"] == 2, "a refused POST changed the models"
    same_origin = {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}",
                   "Content-Type": "application/json", "Content-Length": str(len(body))}
    assert raw_request(port, "POST", "/api/models", same_origin, body)[1]["heads"] == 1


def test_an_upload_needs_a_binary_content_type(http_server) -> None:
    _, port = http_server
    body = png(8, 8)
    status, answer = raw_request(port, "POST", "/api/upload?name=x.png", {
        "Host": f"127.0.0.1:{port}", "Content-Type": "multipart/form-data; boundary=x",
        "Content-Length": str(len(body))}, body)
    assert status == 415 and "application/octet-stream" in answer["error"]


@pytest.mark.parametrize("length, status, message", [
    ("abc", 400, "Content-Length 'abc' is not a number"),
    ("-5", 400, "Content-Length -5 is negative"),
    (str(1 << 40), 413, "at most"),
])
def test_a_bad_content_length_is_answered_not_dropped(http_server, length: str, status: int, message: str) -> None:
    _, port = http_server
    answer_status, answer = raw_request(port, "POST", "/api/weights", {
        "Host": f"127.0.0.1:{port}", "Content-Type": "application/json", "Content-Length": length}, b"")
    assert answer_status == status and message in answer["error"]
    assert raw_request(port, "GET", "/api/state", {"Host": f"127.0.0.1:{port}"})[0] == 200


def test_a_content_length_that_lies_times_out_instead_of_hanging(untrained: ModelSet, monkeypatch) -> None:
    import socket
    import time

    from experiments.playground import app

    monkeypatch.setattr(app, "READ_TIMEOUT_S", 1.0)  # the handler class reads it when serve() builds it
    http = serve(Playground(untrained, cifar=None, untrained=untrained), 0)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    port = http.server_address[1]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            start = time.monotonic()
            sock.sendall(f"POST /api/weights HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json"
                         f"\r\nContent-Length: 100\r\n\r\n{{}}".encode())
            chunks = []
            while chunk := sock.recv(65536):  # the server closes the connection after answering
                chunks.append(chunk)
            answer = b"".join(chunks).decode()
            assert answer.startswith("HTTP/1.0 408") and "stopped arriving" in answer
            assert time.monotonic() - start < 20
        assert raw_request(port, "GET", "/api/state", {"Host": f"127.0.0.1:{port}"})[0] == 200
    finally:
        http.shutdown()
        http.server_close()


def test_uploads_are_capped_by_decoded_pixels_and_few_are_kept(untrained: ModelSet) -> None:
    from experiments.playground.app import MAX_UPLOADS
    from experiments.playground.images import KEPT_SIDE, MAX_UPLOAD_PIXELS, ImageError

    playground = Playground(untrained, cifar=None, untrained=untrained)
    bomb = io.BytesIO()
    Image.new("1", (10_000, MAX_UPLOAD_PIXELS // 10_000 + 1)).save(bomb, format="PNG")  # a small file
    assert len(bomb.getvalue()) < 1 << 20
    with pytest.raises(ImageError, match="Mpx decoded"):
        playground.upload(bomb.getvalue(), "bomb.png")
    added = playground.upload(png(3000, 2000), "big.png")
    kept = playground.uploads[added["id"]][1]
    assert max(kept.shape[:2]) == KEPT_SIDE and kept.shape[2] == 3
    for i in range(MAX_UPLOADS + 2):
        playground.upload(png(8, 8), f"{i}.png")
    assert len(playground.uploads) == MAX_UPLOADS


@pytest.mark.parametrize("argv, message", [
    (["--port", "99999"], "99999 is not a port number"),
    (["--port", "-1"], "-1 is not a port number"),
    (["--img-size", "40000"], "the playground shows at most 1024 tokens"),
])
def test_cli_refuses_hostile_sizes_in_one_line(argv: list[str], message: str, capsys) -> None:
    try:
        status = playground_main(argv)
    except SystemExit as stopped:
        status = stopped.code
    out, err = capsys.readouterr()
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err


def _npz_object_arrays(path: Path) -> None:
    import numpy as np

    np.savez(path, x_test=np.array([object()], dtype=object), y_test=np.zeros(1, dtype=np.int64),
             classes=np.array(["a"]))


def _npz_missing_keys(path: Path) -> None:
    import numpy as np

    np.savez(path, x_train=np.zeros((1, 4, 4, 3), dtype=np.uint8))


def _npz_truncated(path: Path) -> None:
    import numpy as np

    np.savez(path, x_test=np.zeros((4, 8, 8, 3), dtype=np.uint8), y_test=np.zeros(4, dtype=np.int64),
             classes=np.array(["a"]))
    path.write_bytes(path.read_bytes()[:200])


@pytest.mark.parametrize("write, message", [
    (_npz_object_arrays, "cannot be read (ValueError"),
    (_npz_missing_keys, "has no x_test, y_test, classes"),
    (_npz_truncated, "cannot be read"),
])
def test_cli_refuses_a_broken_cifar_file_in_one_line(tmp_path: Path, write, message: str, capsys) -> None:
    path = tmp_path / "cifar.npz"
    write(path)
    status = playground_main(["--port", "0", "--cifar", str(path), "--mixers", "linear"])
    out, err = capsys.readouterr()
    assert status == 2 and "playground:" not in out
    assert len(err.strip().splitlines()) == 1 and message in err and str(path) in err


def save_untrained(folder: Path, name: str, key: object, *, mixer: str = "linear", in_chans: int = 3,
                   mean: tuple[float, ...] = (0.5, 0.5, 0.5), std: tuple[float, ...] = (0.5, 0.5, 0.5)) -> Path:
    point = Point(mixer=mixer, preset="micro", img_size=16, patch_size=4, batch_size=1, overrides='{"depth":1}')
    model = build_model(point, num_classes=2, in_chans=in_chans)
    path = folder / "weights" / f"{name}.safetensors"
    save_weights(path, model, key, num_classes=2, in_chans=in_chans, mean=mean, std=std)
    return path


GOOD_KEY = {"mixer": "linear", "preset": "micro", "img_size": 16, "patch_size": 4, "overrides": '{"depth":1}'}


@pytest.mark.parametrize("key, mean, std, message", [
    (["linear", 16], (0.5,) * 3, (0.5,) * 3, "its key is a list"),
    ({k: v for k, v in GOOD_KEY.items() if k != "img_size"}, (0.5,) * 3, (0.5,) * 3, "its key lacks img_size"),
    (GOOD_KEY, (0.5,) * 3, (0.0,) * 3, "must be positive"),
    (GOOD_KEY, (0.5, 0.5), (0.5,) * 3, "2 mean value(s) for 3 image channel(s)"),
])
def test_a_damaged_weights_header_is_refused_by_name(server, tmp_path: Path, key: object, mean: tuple, std: tuple,
                                                     message: str) -> None:
    path = save_untrained(tmp_path, "bad", key, mean=mean, std=std)
    with pytest.raises(WeightsError, match="damaged header") as refused:
        ModelSet.from_folder(tmp_path)
    assert message in str(refused.value) and str(path) in str(refused.value)
    status, answer = server("/api/weights", json.dumps({"folder": str(tmp_path)}).encode())
    assert status == 400 and message in answer["error"]
    status, _ = server("/api/rows?image=example-0&patch=0")
    assert status == 200


# --- Loading a sweep with a learning-rate grid (issue 36) ----------------------------------------------------------


def write_rate_grid_sweep(folder: Path) -> Path:
    """A sweep folder with a learning-rate grid: attention and linear at two rates and two seeds each, weights
    saved for every point, and grid rows whose validation accuracy prefers 1e-3 for attention, 3e-4 for linear
    (their test accuracy would choose the other way)."""
    import csv

    from experiments.schema import KEY_COLUMNS

    rows = []
    for mixer, accuracies in (("attention", {3e-4: 0.5, 1e-3: 0.7}), ("linear", {3e-4: 0.8, 1e-3: 0.6})):
        for lr, val in accuracies.items():
            for seed in (0, 1):
                point = Point(mixer=mixer, preset="micro", img_size=16, patch_size=4, batch_size=1, dataset="reach",
                              epochs=1, seed=seed, overrides='{"depth":1}', train=json.dumps({"lr": lr}))
                key = {column: getattr(point, column) for column in KEY_COLUMNS}
                save_untrained(folder, f"{mixer}-{lr}-{seed}", key, mixer=mixer)
                rows.append({**key, "lr_stage": "grid", "val_accuracy": val, "accuracy": 1 - val, "status": "ok"})
    with open(folder / "runs.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*KEY_COLUMNS, "lr_stage", "val_accuracy", "accuracy", "status"])
        writer.writeheader()
        writer.writerows(rows)
    return folder


def test_load_picks_the_rate_the_sweep_chose_and_says_so(tmp_path: Path) -> None:
    write_rate_grid_sweep(tmp_path)
    models = ModelSet.from_folder(tmp_path)
    assert "attention-0.001-0.safetensors" in models.labels["attention"]
    assert "linear-0.0003-0.safetensors" in models.labels["linear"]
    assert "lr 1e-3, chosen on validation among 2" in models.labels["attention"]
    assert "lr 3e-4, chosen on validation" in models.labels["linear"]
    notes = " ".join(models.notes)
    assert "4 weights file(s)" in notes and "learning rate the sweep did not choose" in notes
    assert "2 weights file(s)" in notes and "other seeds" in notes
    assert "sizes or data sets" not in notes and "data set, image size" not in notes  # none of those left out


def test_the_page_chooses_mixers_and_the_number_of_heads(server) -> None:
    status, state = server("/api/models", json.dumps({"mixers": ["linear", "attention"]}).encode())
    assert status == 200 and state["mixers"] == ["attention", "linear"] and state["available"] == list(MIXERS)
    status, rows = server("/api/rows?image=example-0&patch=5")
    assert [p["mixer"] for p in rows["panels"]] == ["attention", "linear", "conv 3x3"]
    status, state = server("/api/models", json.dumps({"heads": 4}).encode())
    assert status == 200 and state["heads"] == 4 and state["heads_options"] == [1, 2, 4, 8]
    status, rows = server("/api/rows?image=example-0&patch=5")
    attention = rows["panels"][0]
    assert attention["heads"] == 4 and len(attention["maps"]) == 4
    status, answer = server("/api/models", json.dumps({"heads": 3}).encode())
    assert status == 400 and "choose one of [1, 2, 4, 8]" in answer["error"]
    status, answer = server("/api/models", json.dumps({"mixers": ["nope"]}).encode())
    assert status == 400 and "no model for nope" in answer["error"]
    status, state = server("/api/weights", json.dumps({"folder": ""}).encode())  # back to untrained: 4 heads kept
    assert state["heads"] == 4 and state["mixers"] == ["attention", "linear"]


def test_neighborhood_looks_local_on_the_default_grid() -> None:
    from experiments.playground.model_set import untrained_options

    assert untrained_options("neighborhood", 8) == {"kernel_size": 5}  # 25 of 64 cells, not 49
    assert untrained_options("neighborhood", 4) == {"kernel_size": 3}
    assert untrained_options("neighborhood", 32) == {"kernel_size": 7}  # NAT's own kernel where it is local


def test_cifar_is_found_beside_the_repository_not_the_current_folder() -> None:
    from experiments.playground.images import DEFAULT_CIFAR

    repo = Path(__file__).resolve().parent.parent
    assert DEFAULT_CIFAR == repo.parent / "shared" / "data" / "cifar10-subset.npz"


@pytest.mark.parametrize("argv, message", [
    (["--mixers", "mambaa"], "argument --mixers: invalid choice: 'mambaa'"),
    (["--clicks", "1"], "argument --clicks: must be in 2 .."),
])
def test_the_click_benchmark_refuses_bad_arguments_in_one_line(argv: list[str], message: str, capsys) -> None:
    from experiments.bench.playground_rows import main as bench_main

    with pytest.raises(SystemExit) as stopped:
        bench_main(argv)
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and len(err.strip().splitlines()) == 1 and message in err


def test_the_click_benchmark_times_the_api(capsys) -> None:
    from experiments.bench.playground_rows import main as bench_main

    assert bench_main(["--mixers", "linear", "--clicks", "2", "--layers", "1"]) == 0
    out = capsys.readouterr().out
    assert "linear" in out and "first click" in out and "next clicks" in out


def test_a_mixer_without_an_exact_map_gets_its_gradient_row_once_per_query(monkeypatch) -> None:
    """The gradient fallback (one backward per output channel) is the slow path: a query seen before is read."""
    import numpy as np

    from experiments.playground import model_set
    from experiments.playground.mixing import MixingRows, family_of, gradient_row

    models = ModelSet.untrained(("linear",), img_size=16, patch_size=4)
    monkeypatch.setattr(model_set, "mixing_maps", lambda *args, **kwargs: None)  # as for a user's mixer
    calls = []

    def gradient_rows(mixer, x, grid, query, **kwargs) -> MixingRows:
        calls.append(query)
        return MixingRows("gradient", gradient_row(mixer, x, grid, query)[None], ("gradient",), "")

    monkeypatch.setattr(model_set, "mixing_rows", gradient_rows)
    image = np.zeros((16, 16, 3), dtype=np.uint8)
    first = models.rows(image, 5, 1, image_key="example-0")["linear"]
    again = models.rows(image, 5, 1, image_key="example-0")["linear"]
    models.rows(image, 6, 1, image_key="example-0")
    assert calls == [5, 6] and torch.equal(first.rows, again.rows) and first.family == "gradient"
    assert family_of(models.models["linear"].blocks[1].mixer) == "linear"  # only the map was withheld
