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
    """Opens ``url``, waits until every text of ``wait_for`` is visible and the page has loaded what it shows (no
    "Loading..." left: the asset nodes fill in their latest events after their names), saves a PNG and returns the
    page's text. A page still loading at the timeout is a BrowserError, not a screenshot of placeholders."""
    with browser_page() as page:
        page.goto(url)
        wait_for_texts(page, wait_for, timeout_s)
        text = _settled_text(page.locator("body"), timeout_s)
        if "Loading" in text:
            raise BrowserError(f"{url} still showed 'Loading' after {timeout_s:.0f} s")
        Path(png).parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(png))
        return page.inner_text("body")


def _settled_text(locator, timeout_s: float) -> str:
    """The locator's text once the UI has loaded it (no "Loading..." left), or what it shows at the timeout."""
    import time

    deadline = time.monotonic() + timeout_s
    text = locator.inner_text()
    while "Loading" in text and time.monotonic() < deadline:
        time.sleep(0.5)
        text = locator.inner_text()
    return text


def asset_node_text(page, group_url: str, asset: str, timeout_s: float = 60) -> str:
    """The text of ``asset``'s node in a lineage graph (its name, latest event, checks summary and status row), as
    the page at ``group_url`` shows it after loading."""
    page.goto(group_url)
    wait_for_texts(page, (asset,), timeout_s)
    node = page.locator("div", has=page.get_by_text(asset, exact=True)).filter(has_text="Latest event").last
    return _settled_text(node, timeout_s)


def catalog_row_text(page, catalog_url: str, asset: str, timeout_s: float = 60) -> str:
    """The text of ``asset``'s row in the asset catalog (name, description, location, status), after loading."""
    page.goto(catalog_url)
    wait_for_texts(page, (asset,), timeout_s)
    row = page.locator("div", has=page.get_by_text(asset, exact=True)).filter(has_text=LOCATION_HINT).last
    return _settled_text(row, timeout_s)


LOCATION_HINT = "two_phase_pipelines"  # the code location's name, shown in every catalog row


def wait_for_asset_state(read, expected: str, timeout_s: float = 90, every_s: float = 3) -> str:
    """Calls ``read()`` (one of the functions above, bound to a page) until its text shows ``expected``; returns
    that text, or raises with the last text seen. The UI polls on its own schedule: each call loads the page anew."""
    import time

    deadline, text = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        text = read()
        if expected in text:
            return text
        time.sleep(every_s)
    raise BrowserError(f"expected {expected!r} within {timeout_s:.0f} s; the page showed: {text!r}")
