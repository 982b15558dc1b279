"""``siglo ui`` in a real browser: Debian's chromium and chromium-driver (apt), driven by
selenium; nothing downloads a browser. The command runs as a user runs it (``siglo ui
URL``, its settings from the environment), on SQLite, PostgreSQL and Redis: page loads,
filters, a run's page, an action, the token; paging across 10,000 runs on SQLite.

``SIGLO_UI_SCREENSHOTS=docs/images`` writes the screenshots of docs/observability.md
(``ui-*.png``); otherwise they go to the test's temporary directory.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from ops_support import DURABLE_KINDS, shared_store
from ports import free_port
from ui_support import FIELD, NAMESPACE, SECRET, seed

import siglo
from siglo.coordination import holder_label
from siglo.locking import Lease, current_lease

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
SETTINGS = siglo.Settings(redact_fields=frozenset({FIELD}))
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    if CHROMIUM is None or DRIVER is None:
        why = "no chromium/chromedriver: apt-get install -y chromium chromium-driver"
        if os.environ.get("CI") == "true":
            pytest.fail(why)  # CI must run the browser, as it must reach every backend
        pytest.skip(why)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(DRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    where = os.environ.get("SIGLO_UI_SCREENSHOTS")
    path = ROOT / where if where else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # up (a token refuses)
    except OSError:
        return False


@asynccontextmanager
async def serve(url: str, *args: str) -> AsyncIterator[str]:
    """``siglo ui URL`` in its own process, as a user starts it; its base URL."""
    port = free_port(30700, 30800)
    env = {**os.environ, "SIGLO_REDACT_FIELDS": FIELD}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "siglo",
        "ui",
        url,
        "--port",
        str(port),
        *args,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not await asyncio.to_thread(_answers, f"{base}/ui.css"):
            if process.returncode is not None or time.monotonic() > deadline:
                process.kill()
                assert process.stderr is not None
                raise AssertionError((await process.stderr.read()).decode())
            await asyncio.sleep(0.1)
        yield base
    finally:
        if process.returncode is None:
            process.terminate()
        await asyncio.wait_for(process.wait(), 10)


@asynccontextmanager
async def seeded(kind: str, *, bulk: int) -> AsyncIterator[str]:
    async with shared_store(kind) as backend:
        async with siglo.connect(backend.url, settings=SETTINGS) as piped:
            await seed(piped, SETTINGS, bulk=bulk, overdue=True)
        yield backend.url


def navigate(driver: webdriver.Chrome, by: str, what: str) -> None:
    """Click what leads to another page, and wait until the next page replaced it.

    While the old page is being torn down, chromedriver can answer a question about its
    element with an error other than "stale" (its execution context gone, a renderer
    slow to answer on a loaded machine): the wait asks again, until the element is
    stale or the 30 s are up (a ``TimeoutException`` then, with the last error).
    """
    from selenium.common.exceptions import WebDriverException

    old = driver.find_element(By.TAG_NAME, "html")
    driver.find_element(by, what).click()
    WebDriverWait(driver, 30, ignored_exceptions=(WebDriverException,)).until(
        expected_conditions.staleness_of(old)
    )


def text(driver: webdriver.Chrome, css: str) -> str:
    """The text of the element at ``css``; when the page has none, the failure shows
    what the page said instead (an error page, a timeout)."""
    from selenium.common.exceptions import NoSuchElementException

    try:
        return str(driver.find_element(By.CSS_SELECTOR, css).text)
    except NoSuchElementException:
        body = driver.find_element(By.TAG_NAME, "body").text
        raise AssertionError(
            f"no {css} on {driver.current_url} ({driver.title!r}); the page said: {body[:2000]}"
        ) from None


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_pages_filters_a_run_and_an_action(
    kind: str, browser: webdriver.Chrome, shots: Path
) -> None:
    async with seeded(kind, bulk=60) as url, serve(url) as base:
        browser.get(f"{base}/runs")
        assert browser.title == "Runs · siglo ui"
        assert text(browser, "#count-waiting") == "waiting 15"  # 12 + 2 orders + 1 reminder
        assert "***" not in text(browser, "#store") or ":" not in url.split("@")[0]
        if kind == "sqlite":
            browser.save_screenshot(str(shots / "ui-runs.png"))

        # Filters: the form, as a user fills it.
        Select(browser.find_element(By.ID, "status")).select_by_visible_text("waiting")
        browser.find_element(By.NAME, "namespace").send_keys(NAMESPACE)
        navigate(browser, By.ID, "apply")
        rows = browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")
        assert sorted(r.find_element(By.TAG_NAME, "a").text for r in rows) == [
            "order-1",
            "order-2",
        ]

        # One run: its page, redacted fields redacted.
        navigate(browser, By.LINK_TEXT, "order-1")
        assert text(browser, "#run-id") == "order-1"
        assert text(browser, "#status") == "waiting"
        page = browser.page_source
        assert SECRET not in page and "[REDACTED]" in text(browser, "#contexts")
        assert "approve:o-1" in text(browser, "#waits")
        if kind == "sqlite":
            browser.save_screenshot(str(shots / "ui-run.png"))

        # An action: deliver the event, confirmed.
        navigate(browser, By.ID, "deliver")
        payload = browser.find_element(By.ID, "payload")
        payload.clear()
        payload.send_keys(f'{{"by": "browser", "card": "{SECRET}"}}')
        if kind == "sqlite":
            browser.save_screenshot(str(shots / "ui-confirm.png"))
        navigate(browser, By.ID, "confirm-button")
        assert browser.title == "Done · siglo ui", text(browser, "main")
        assert "continues on the next" in text(browser, "#message")
        navigate(browser, By.ID, "back")
        assert text(browser, "#status") == "running"
        assert SECRET not in browser.page_source

        # What needs attention: the overdue reminder, the bulk runs left running (no
        # process holds their lock), and one whose lock this process holds meanwhile.
        async with siglo.connect(url, settings=SETTINGS) as holder:
            holding, release = asyncio.Event(), asyncio.Event()

            leases: list[Lease] = []

            async def hold() -> None:
                lease = current_lease()
                assert lease is not None
                leases.append(lease)
                holding.set()
                await release.wait()

            held = asyncio.create_task(holder.adapter.with_workflow_lock("bulk-00003", hold))
            await holding.wait()
            try:
                label = holder_label(leases[0].token)
                await asyncio.to_thread(navigate, browser, By.ID, "nav-attention")
                assert "remind:r-1" in text(browser, "#overdue")
                held_rows = text(browser, "#held")
                assert "bulk-00003" in held_rows and label in held_rows
                assert re.search(r"expires in \d+ s", held_rows), held_rows
                assert "bulk-00003" not in text(browser, "#crashed")
                assert int(text(browser, "#n-crashed")) >= 11
                assert leases[0].token not in browser.page_source
                if kind == "sqlite":
                    browser.set_window_size(1280, 1400)  # the page's three tables
                    browser.save_screenshot(str(shots / "ui-attention.png"))
                    browser.set_window_size(1280, 900)
                # The held run's page: its holder and the lease left.
                await asyncio.to_thread(navigate, browser, By.LINK_TEXT, "bulk-00003")
                assert text(browser, "#lock-holder") == label
                assert re.fullmatch(r"expires in \d+ s", text(browser, "#lock-lease"))
                assert leases[0].token not in browser.page_source
                if kind == "sqlite":
                    browser.save_screenshot(str(shots / "ui-run-lock.png"))
            finally:
                release.set()
                await held


async def test_paging_across_10000_runs(browser: webdriver.Chrome) -> None:
    async with seeded("sqlite", bulk=10_000) as url, serve(url) as base:
        browser.get(f"{base}/runs?limit=1000")
        assert text(browser, "#counts").startswith("all 10004")
        seen: list[str] = []
        pages = 0
        while True:
            pages += 1
            # One call for the page's ids (not one driver round trip per cell).
            seen.extend(
                browser.execute_script(
                    "return Array.from(document.querySelectorAll("
                    "'#runs tbody tr td:first-child a'), a => a.textContent)"
                )
            )
            if not browser.find_elements(By.ID, "next"):
                break
            navigate(browser, By.ID, "next")
        assert pages == 11
        assert len(seen) == len(set(seen)) == 10_004
        assert f"page {pages}" in text(browser, "#paging")
        navigate(browser, By.ID, "first")
        assert "page 1 " in text(browser, "#paging") + " "


async def test_the_token(browser: webdriver.Chrome) -> None:
    async with seeded("sqlite", bulk=0) as url, serve(url, "--token", "s3cret-token") as base:
        browser.get(f"{base}/runs")
        assert "needs its token" in browser.find_element(By.TAG_NAME, "body").text
        browser.get(f"{base}/runs?token=wrong")
        assert "needs its token" in browser.find_element(By.TAG_NAME, "body").text
        browser.get(f"{base}/runs?token=s3cret-token")
        assert browser.title == "Runs · siglo ui"
        assert "token" not in browser.current_url  # moved to a cookie
        browser.get(f"{base}/attention")
        assert browser.title == "Attention · siglo ui"
    browser.delete_all_cookies()


def test_a_bind_beyond_loopback_needs_a_token() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "siglo", "ui", "memory://", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "a token is required" in done.stderr
