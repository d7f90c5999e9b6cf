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
