"""End to end in a real browser: start the app, drive Debian's headless Chromium with Playwright.

For each page: load it, check the headline number, change an input, check the new number and
that a plotly chart rendered. With SAVE_SCREENSHOTS=1 each page is saved to
docs/screenshots/<page>.png (the README shows them). No browser is downloaded: Playwright
drives /usr/bin/chromium (Debian's `chromium` package). Skipped, with the reason, where either
is missing. Run: .venv/bin/python -m pytest -m browser tests/browser/test_pages_in_chromium.py
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from attnmem.calc import (
    GPUS,
    IMPL_LABELS,
    MODELS,
    format_bytes,
    max_seq_len,
    model_memory,
)
from attnmem.calc.io_model import standard_io

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import load_test  # noqa: E402  (server start-up and Chromium flags shared with the load test)

CHROMIUM, LAUNCH_ARGS = load_test.CHROMIUM, load_test.LAUNCH_ARGS
SHOTS = ROOT / "docs" / "screenshots"
SAVE = os.environ.get("SAVE_SCREENSHOTS") == "1"
TIMEOUT_MS = 60_000

try:
    from playwright.sync_api import Page, expect, sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None


def _skip_reason() -> str | None:
    if sync_playwright is None:
        return "the playwright Python package is not installed (pip install -r requirements-dev.txt)"
    if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    return None


if (_reason := _skip_reason()) is not None:
    pytest.skip(f"browser test skipped: {_reason}", allow_module_level=True)


@contextlib.contextmanager
def _app_server() -> Iterator[str]:
    """The app on a free localhost port (scripts/load_test.app_server); killed at the end."""
    port_log = ROOT / ".pytest_cache" / "streamlit-browser-test.log"
    try:
        with load_test.app_server(port_log if port_log.parent.is_dir() else None,
                                  extra_args=("--client.toolbarMode", "minimal")) as (url, _pid):
            yield url
    except RuntimeError as err:  # the server did not start: a failure, not an error
        pytest.fail(str(err))


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with _app_server() as url:
        yield url


@pytest.fixture(scope="module")
def browser_page(server: str) -> Iterator[Page]:
    with sync_playwright() as p:
        exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
        browser = p.chromium.launch(executable_path=exe, args=LAUNCH_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            yield page
        finally:
            browser.close()


def _open(page: Page, url: str) -> None:
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector('[data-testid="stMetricValue"]', timeout=TIMEOUT_MS)
    _wait_idle(page)


def _wait_idle(page: Page) -> None:
    """Wait until the script run finished (no 'running' status widget) and charts drew."""
    page.wait_for_timeout(300)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=TIMEOUT_MS
    )
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=TIMEOUT_MS)


def _metrics(page: Page) -> list[str]:
    return [t.strip() for t in page.locator('[data-testid="stMetricValue"]').all_inner_texts()]


def _set_number(page: Page, label: str, value: int) -> None:
    box = page.get_by_label(label, exact=True).first
    box.fill(str(value))
    box.press("Enter")


def _expect_metric(page: Page, text: str) -> None:
    expect(page.locator('[data-testid="stMetricValue"]', has_text=text).first).to_be_visible(timeout=TIMEOUT_MS)


def _shot(page: Page, name: str) -> None:
    if SAVE:
        SHOTS.mkdir(parents=True, exist_ok=True)
        _wait_idle(page)
        size = page.viewport_size
        page.set_viewport_size({"width": 1400, "height": 1500})  # Streamlit scrolls inside
        page.wait_for_timeout(1200)  # a container: make the viewport hold the page's top
        page.screenshot(path=str(SHOTS / f"{name}.png"))
        if size:
            page.set_viewport_size(size)
            page.wait_for_timeout(300)


def test_score_matrix_page(browser_page: Page, server: str) -> None:
    page = browser_page
    _open(page, f"{server}/score_matrix")
    _expect_metric(page, "1.07 GB")
    assert "1.07 GB" in _metrics(page)
    assert page.locator(".js-plotly-plot .main-svg").count() >= 1
    _shot(page, "score_matrix")
    _set_number(page, "exact", 8192)
    _expect_metric(page, "4.29 GB")
    _wait_idle(page)
    assert "s=8192" in page.url  # the view is in the URL
    with page.expect_download(timeout=TIMEOUT_MS) as dl:
        page.get_by_text("Numbers (CSV)").first.click()
    rows = list(csv.DictReader(io.StringIO(Path(dl.value.path()).read_text())))
    assert {"seq_len", "bytes"} <= set(rows[0])
    assert any(r["seq_len"] == "8192" and r["bytes"] == "4294967296" for r in rows)  # 8192² · 32 · 2


def test_url_prefills_and_bad_values_warn(browser_page: Page, server: str) -> None:
    page = browser_page
    _open(page, f"{server}/?s=8192&h=32&b=1&dtype=fp16")  # made when Score matrix was at "/"
    _expect_metric(page, "4.29 GB")
    page.wait_for_url("**/score_matrix?*")
    _open(page, f"{server}/?s=NaN&h=%5Bx%5D(javascript:alert(1))")
    _expect_metric(page, "1.07 GB")
    alerts = page.locator('[data-testid="stAlert"]').all_inner_texts()
    assert any("'s'" in a and "NaN" in a for a in alerts), alerts
    assert page.locator("a[href^='javascript']").count() == 0


def test_root_is_will_it_fit_and_its_old_address_still_opens_it(browser_page: Page, server: str) -> None:
    """ "/" opens Will it fit? (the first page in the sidebar); a link to /will_it_fit, where it
    was served before, opens the same view at "/" with its inputs and no 'page not found'."""
    page = browser_page
    page.goto(f"{server}/", wait_until="domcontentloaded")
    expect(page.locator("h1", has_text="Will it fit?")).to_be_visible(timeout=TIMEOUT_MS)
    expect(page.locator('[data-testid="stMetricLabel"]', has_text="Peak").first).to_be_visible(
        timeout=TIMEOUT_MS)
    page.goto(f"{server}/will_it_fit?task=serving&s=4096&gpu=NVIDIA%20A100%2040GB",
              wait_until="domcontentloaded")
    page.wait_for_url(lambda u: urlsplit(u).path == "/" and "task=serving" in u, timeout=TIMEOUT_MS)
    expect(page.locator("h1", has_text="Will it fit?")).to_be_visible(timeout=TIMEOUT_MS)
    expect(page.get_by_label("Task", exact=True).first).to_have_value(
        "Serving: vLLM, concurrent requests", timeout=TIMEOUT_MS)
    expect(page.get_by_label("exact", exact=True).first).to_have_value("4096")
    assert "s=4096" in page.url and "A100" in unquote(page.url)
    assert page.get_by_text("Page not found").count() == 0


def test_model_memory_page(browser_page: Page, server: str) -> None:
    page = browser_page
    _open(page, f"{server}/model_memory")
    model = MODELS["Llama 3.1 8B"]
    total = model_memory(model, 1, 8192, "bf16", "bf16", "bf16", "naive").total_bytes
    _expect_metric(page, format_bytes(total, "GB"))
    _shot(page, "model_memory")
    _set_number(page, "Batch size", 4)
    total4 = model_memory(model, 4, 8192, "bf16", "bf16", "bf16", "naive").total_bytes
    _expect_metric(page, format_bytes(total4, "GB"))
    _wait_idle(page)


def test_scaling_page(browser_page: Page, server: str) -> None:
    page = browser_page
    _open(page, f"{server}/scaling")
    gpu = "NVIDIA H200 141GB"
    _expect_metric(page, f"{max_seq_len('naive', GPUS[gpu], 1, 32, 128, 'fp16'):,}")
    assert page.locator(".js-plotly-plot").count() >= 1
    # the batch sweep's chart is drawn once its expander is opened (a lazy expander)
    page.get_by_text("Chart: extra peak against batch size B").click()
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 2",
                           timeout=30_000)
    _shot(page, "scaling")
    _set_number(page, "Heads H", 64)
    _expect_metric(page, f"{max_seq_len('naive', GPUS[gpu], 1, 64, 128, 'fp16'):,}")
    assert IMPL_LABELS["naive"]


def test_flash_explainer_page(browser_page: Page, server: str) -> None:
    page = browser_page
    _open(page, f"{server}/flash_explainer?step=5")
    _expect_metric(page, format_bytes(standard_io(1, 32, 4096, 128, 2).total_bytes, "GB"))
    _shot(page, "flash_explainer")
    _set_number(page, "sequence s", 8192)
    _expect_metric(page, format_bytes(standard_io(1, 32, 8192, 128, 2).total_bytes, "GB"))


def test_kernel_speed_page(browser_page: Page, server: str) -> None:
    """The measured H200 kernel table: the default kernel's TFLOP/s at the longest length."""
    from attnmem.measure.speed_results import read_rows

    rows = read_rows(ROOT / "data" / "kernel_speed_fwd_eager_h200.csv")
    want = next(r.tflops for r in rows if (r.impl, r.dtype, r.head_dim, r.causal, r.mode,
                                           r.seq_len) == ("triton", "bf16", 128, False, "fwd", 16384))
    page = browser_page
    _open(page, f"{server}/kernel_speed")
    _expect_metric(page, f"{want:.0f} TFLOP/s")
    assert page.locator(".js-plotly-plot").count() >= 1
    _shot(page, "kernel_speed")


def test_measurement_page_renders(browser_page: Page, server: str) -> None:
    """The GPU measurement page (its own issue) loads through the router and draws its charts
    (without a GPU: the bundled reference measurements); screenshot for the README."""
    page = browser_page
    page.goto(f"{server}/measure", wait_until="domcontentloaded")
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=TIMEOUT_MS)
    _wait_idle(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    _shot(page, "measure")


def test_unit_switch_is_remembered_across_pages(browser_page: Page, server: str) -> None:
    page = browser_page
    _open(page, f"{server}/score_matrix?dtype=custom&e=0.5")
    page.locator('[data-testid="stSidebar"]').get_by_text("GiB", exact=True).click()
    _wait_idle(page)
    assert "unit=GiB" in page.url
    _set_number(page, "Attention heads H", 64)
    _expect_metric(page, "512.00 MiB")  # 64 · 4096² · 0.5 bytes: below 1 GiB, in MiB
    page.locator('[data-testid="stSidebarNav"]').get_by_text("Scaling").click()
    page.wait_for_url("**/scaling**")
    _wait_idle(page)
    assert page.locator("text=GiB").count() > 0
    assert "unit=GiB" in page.url
    # the heads chosen on one page carry over to the next (same URL name, same meaning)
    expect(page.get_by_label("Heads H", exact=True).first).to_have_value("64", timeout=TIMEOUT_MS)
    page.locator('[data-testid="stSidebarNav"]').get_by_text("Score matrix").click()
    _wait_idle(page)
    # back on the score page: H, the unit and its own 'custom 0.5 bytes' dtype are all still there
    # (Scaling's dtype input has no 'custom', so it does not overwrite the score page's choice)
    _expect_metric(page, "512.00 MiB")


def test_dark_theme_is_readable(server: str, browser_page: Page) -> None:
    """With the system in dark mode the app and its charts turn dark (no hard-coded white)."""
    context = browser_page.context.browser.new_context(
        viewport={"width": 1400, "height": 1000}, color_scheme="dark"
    )
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        _open(page, f"{server}/scaling")
        bg = page.evaluate(
            "() => getComputedStyle(document.querySelector('[data-testid=\"stApp\"]')).backgroundColor"
        )
        rgb = [int(x) for x in bg[bg.index("(") + 1 : bg.index(")")].split(",")[:3]]
        assert sum(rgb) < 3 * 80, f"app background is not dark: {bg}"
        paper = page.evaluate(
            "() => getComputedStyle(document.querySelector('.js-plotly-plot .main-svg')).backgroundColor"
        )
        assert "255, 255, 255" not in paper, f"chart keeps a white background in dark mode: {paper}"
        _shot(page, "scaling_dark")
    finally:
        context.close()


def test_deep_link_on_a_fresh_server_gets_the_router(browser_page: Page) -> None:
    """A fresh server's first request, straight to a page, still runs through app.py's router
    (no pages/ folder beside app.py puts Streamlit in its old multipage mode)."""
    with _app_server() as url:
        page = browser_page
        _open(page, f"{url}/scaling?h=64")
        sidebar = page.locator('[data-testid="stSidebar"]')
        expect(sidebar.get_by_text("Memory unit")).to_be_visible(timeout=TIMEOUT_MS)
        expect(sidebar.get_by_text("How FlashAttention works")).to_be_visible()
        assert sidebar.get_by_text("common", exact=True).count() == 0
        expect(page.get_by_label("Heads H", exact=True).first).to_have_value("64")


@pytest.mark.parametrize("path,chart", [("training", True), ("serving", False),
                                        ("many_gpus", True)])
def test_training_serving_and_many_gpus_pages_render(browser_page: Page, server: str, path: str,
                                                     chart: bool) -> None:
    """The pages of the training step, serving and context parallelism show their answer (a
    metric) and, where they have one, their chart in a real browser, without an exception box."""
    page = browser_page
    page.goto(f"{server}/{path}", wait_until="domcontentloaded")
    expect(page.locator('[data-testid="stMetricValue"]').first).to_be_visible(timeout=TIMEOUT_MS)
    if chart:
        _wait_idle(page)
        assert page.locator(".js-plotly-plot .main-svg").count() >= 1
        _shot(page, path)
    elif SAVE:
        page.wait_for_function(
            "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=TIMEOUT_MS)
        page.set_viewport_size({"width": 1400, "height": 1500})
        page.wait_for_timeout(1200)
        page.screenshot(path=str(SHOTS / f"{path}.png"))
    assert _metrics(page), f"{path}: no answer metric shown"
    assert page.locator('[data-testid="stException"]').count() == 0
