"""The playground in a real headless browser: two clicks, every panel changes, swin stays inside its window.

Skipped, with the reason, where selenium, chromium or chromedriver is missing (`.ci/run` installs them where
apt-get is available).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from experiments.playground.browser import BrowserUnavailable, click_patch, open_browser, wait_for_page

REPO = Path(__file__).resolve().parent.parent
GRID = (8, 8)  # the app's default: 32 px images, patch 4
PATCHES = (9, 54)  # (1, 1) and (6, 6): in different swin windows of layer 0, away from the borders


@pytest.fixture()
def app_url():
    """The app started as a user starts it, on a free port; the URL it prints."""
    process = subprocess.Popen([sys.executable, "-m", "experiments.playground", "--port", "0"], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("playground: http://127.0.0.1:"), (line, process.stderr.read() if not line else "")
        yield line.split()[1]
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture()
def driver():
    try:
        browser = open_browser()
    except BrowserUnavailable as error:
        pytest.skip(f"no headless browser: {error}")
    yield browser
    browser.quit()


def panel_rows(driver) -> dict[str, list[float]]:
    return {panel.get_attribute("data-mixer"): json.loads(panel.get_attribute("data-row"))
            for panel in driver.find_elements("css selector", "#panels .panel")}


def swin_window(patch: int, window_size: int) -> set[int]:
    """Tokens in the same unshifted window as `patch` (layer 0 does not shift)."""
    row, col = divmod(patch, GRID[1])
    return {r * GRID[1] + c for r in range(GRID[0]) for c in range(GRID[1])
            if r // window_size == row // window_size and c // window_size == col // window_size}


def message(driver) -> str:
    element = driver.find_element("id", "message")
    return "" if element.get_attribute("hidden") is not None else element.text


def test_clicks_change_every_panel_and_swin_stays_in_its_window(driver, app_url: str, tmp_path: Path) -> None:
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from experiments.playground.model_set import DEFAULT_MIXERS

    wait_for_page(driver, app_url)
    Select(driver.find_element("id", "image-select")).select_by_visible_text("reach (two marks, same shape?)")
    seen = {}
    for patch in PATCHES:
        click_patch(driver, patch, GRID)
        seen[patch] = panel_rows(driver)
        swin = driver.find_element("css selector", '#panels .panel[data-mixer="swin"]')
        assert swin.get_attribute("data-shift") == "0"
        window = swin_window(patch, int(swin.get_attribute("data-window-size")))
        row = seen[patch]["swin"]
        assert all(value == 0 for j, value in enumerate(row) if j not in window)  # exactly zero outside
        assert all(row[j] > 0 for j in window)
    first, second = seen.values()
    assert set(first) == {*DEFAULT_MIXERS, "conv 3x3"}
    for mixer in first:
        assert first[mixer] != second[mixer], f"the {mixer} panel did not change between patches {PATCHES}"
    assert message(driver) == ""
    screenshot = tmp_path / "playground.png"
    driver.save_screenshot(str(screenshot))
    assert Image.open(screenshot).size[0] > 0

    # Bad input: a message in the page, and the server keeps serving.
    tiny = tmp_path / "tiny.png"
    Image.new("RGB", (2, 2)).save(tiny)
    driver.find_element("id", "upload").send_keys(str(tiny))
    WebDriverWait(driver, 20).until(lambda d: "smaller than one 4 x 4 px patch" in message(d))
    empty = tmp_path / "no_weights"
    empty.mkdir()
    driver.find_element("id", "weights-folder").send_keys(str(empty))
    driver.find_element("id", "load-weights").click()
    WebDriverWait(driver, 20).until(lambda d: "no weights in" in message(d))
    click_patch(driver, PATCHES[0], GRID)
    assert panel_rows(driver) == seen[PATCHES[0]]
    assert message(driver) == ""



def test_the_screenshot_script_saves_the_page_after_a_click(tmp_path: Path, capsys) -> None:
    from experiments.playground.__main__ import main

    path = tmp_path / "docs" / "playground.png"
    status = main(["--port", "0", "--screenshot", str(path), "--screenshot-patch", "9"])
    out, err = capsys.readouterr()
    if status == 2 and "no headless browser" in err:
        pytest.skip(err.strip())
    assert status == 0 and f"screenshot: {path}" in out
    width, height = Image.open(path).size
    assert width > 800 and height > 600
