"""A headless Chromium driven by Selenium: for the browser test and the README's screenshot.

Needs Debian's ``chromium`` and ``chromium-driver`` (``apt-get install chromium chromium-driver``) and the
``selenium`` package (the ``playground`` extra). `open_browser` raises `BrowserUnavailable`, saying which of them
is missing, so a caller can skip or stop with that reason.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
WAIT_S = 20.0


class BrowserUnavailable(RuntimeError):
    """No headless browser here; the message says what to install."""


def open_browser(width: int = 1100, height: int = 900):
    """A headless Chromium WebDriver of that window size; the caller quits it.

    Raises:
        BrowserUnavailable: selenium, a Chromium binary or chromedriver is missing, or the browser does not start.
    """
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise BrowserUnavailable("selenium is not installed: pip install -e '.[playground]'") from None
    binary = next((path for path in map(shutil.which, CHROMIUM_NAMES) if path), None)
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        missing = " and ".join(n for n, p in (("chromium", binary), ("chromedriver", driver_path)) if p is None)
        raise BrowserUnavailable(f"{missing} not found: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(argument)
    try:
        # Selenium Manager would try to download a driver; the system's chromedriver is the one that matches.
        return webdriver.Chrome(options=options, service=Service(executable_path=driver_path, env=dict(os.environ)))
    except WebDriverException as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise BrowserUnavailable(f"chromium did not start headless: {first}") from None


def click_patch(driver, patch: int, grid: tuple[int, int]) -> None:
    """Clicks the centre of one patch of the source image, as a user would, and waits for its panels."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import WebDriverWait

    canvas = driver.find_element("id", "image")
    rect = canvas.rect
    row, col = divmod(patch, grid[1])
    # Selenium 4 measures offsets from the element's centre.
    dx = (col + 0.5) * rect["width"] / grid[1] - rect["width"] / 2
    dy = (row + 0.5) * rect["height"] / grid[0] - rect["height"] / 2
    ActionChains(driver).move_to_element_with_offset(canvas, int(dx), int(dy)).click().perform()
    WebDriverWait(driver, WAIT_S).until(
        lambda d: d.find_element("id", "panels").get_attribute("data-patch") == str(patch))


def wait_for_page(driver, url: str) -> None:
    """Loads the page and waits until its first image has been drawn."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, WAIT_S).until(
        lambda d: d.execute_script("return document.getElementById('image-select').options.length > 0 "
                                   "&& picture.complete && picture.naturalWidth > 0"))


def screenshot(url: str, path: Path, patch: int, grid: tuple[int, int], image_name: str | None = None,
               ) -> tuple[Path, list[str]]:
    """Opens the playground at `url`, picks the example named `image_name` (or the first), clicks `patch`, and
    saves a PNG screenshot of the page to `path`; returns the path and the panels shown (mixer names)."""
    driver = open_browser()
    try:
        wait_for_page(driver, url)
        if image_name:
            from selenium.webdriver.support.ui import Select

            Select(driver.find_element("id", "image-select")).select_by_visible_text(image_name)
            wait_for_page_image(driver)
        click_patch(driver, patch, grid)
        path.parent.mkdir(parents=True, exist_ok=True)
        # The window's height includes the browser's frame: grow it until the whole page fits the viewport.
        for _ in range(3):
            page, view = driver.execute_script("return [document.documentElement.scrollHeight, window.innerHeight]")
            if page <= view:
                break
            size = driver.get_window_size()
            driver.set_window_size(size["width"], size["height"] + page - view + 16)
        driver.save_screenshot(str(path))
        shown = [panel.get_attribute("data-mixer") for panel in driver.find_elements("css selector", "#panels .panel")]
    finally:
        driver.quit()
    return path, shown


def wait_for_page_image(driver) -> None:
    """Waits until the image chosen in the select has been loaded and drawn."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT_S).until(
        lambda d: d.execute_script("return picture.complete && picture.src.includes("
                                   "encodeURIComponent(document.getElementById('image-select').value))"))
