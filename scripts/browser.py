"""A real headless browser on the Dagster UI: Playwright driving the system Chromium (no browser download).

Every wait is for an element or a text to be visible, never a fixed time: the UI loads its data after the page, so a
screenshot taken on a timer can show an empty graph.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser")


class BrowserError(RuntimeError):
    pass


def chromium_path() -> str:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise BrowserError("chromium is not installed (scripts/setup.sh installs Debian's chromium package)")


@contextmanager
def browser_page(width: int = 1600, height: int = 1000) -> Iterator:
    """A Playwright page in headless system Chromium."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium_path(),
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()


def wait_for_texts(page, texts: tuple[str, ...], timeout_s: float = 120) -> None:
    """Waits until each text is visible on the page (the first element that has it)."""
    for text in texts:
        try:
            page.get_by_text(text, exact=False).first.wait_for(state="visible", timeout=timeout_s * 1000)
        except Exception as exc:
            raise BrowserError(f"{page.url} did not show {text!r} within {timeout_s:.0f} s: {exc}") from exc


def screenshot(url: str, png: Path, *, wait_for: tuple[str, ...] = (), timeout_s: float = 120) -> str:
    """Opens ``url``, waits until every text of ``wait_for`` is visible, saves a PNG and returns the page's text."""
    with browser_page() as page:
        page.goto(url)
        wait_for_texts(page, wait_for, timeout_s)
        Path(png).parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(png))
        return page.inner_text("body")
