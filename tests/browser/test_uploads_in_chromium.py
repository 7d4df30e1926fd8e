"""Hostile uploads through a real browser: the file chooser of headless Chromium (Playwright,
Debian's /usr/bin/chromium) on a locally started server, the path a user's file takes.

tests/app/test_uploads_hostile.py covers the loaders and the pages' handling with a fake uploader;
this checks the real widget: a 100 MB file is refused before it reaches the server (and the
server's memory does not move), a 100,000-level JSON and a pickle renamed .json are refused
with a message, and no exception reaches the page.
"""

from __future__ import annotations

import pickle
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.robustness, pytest.mark.slow, pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import load_test  # noqa: E402

try:
    from playwright.sync_api import Page, sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

if sync_playwright is None or not (Path(load_test.CHROMIUM).exists() or shutil.which("chromium")):
    pytest.skip("browser upload test skipped: playwright or /usr/bin/chromium is missing",
                allow_module_level=True)

UPLOAD_INPUT = '[data-testid="stFileUploaderDropzoneInput"]'
ALERT = '[data-testid="stAlert"]'
EXCEPTION = '[data-testid="stException"]'


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    with load_test.app_server(log) as (url, pid):
        yield url, pid


@pytest.fixture(scope="module")
def page(app: tuple[str, int]) -> Iterator[Page]:
    exe = load_test.CHROMIUM if Path(load_test.CHROMIUM).exists() else shutil.which("chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=load_test.LAUNCH_ARGS)
        try:
            pg = browser.new_page(viewport={"width": 1400, "height": 1000})
            pg.set_default_timeout(60_000)
            yield pg
        finally:
            browser.close()


def _open_custom_model(page: Page, url: str) -> None:
    page.goto(f"{url}/model_memory?model=Custom%20config.json", wait_until="domcontentloaded")
    page.wait_for_selector(UPLOAD_INPUT, state="attached")
    page.wait_for_selector('[data-testid="stMetricValue"]')


def _upload(page: Page, path: Path) -> None:
    page.locator(UPLOAD_INPUT).first.set_input_files(str(path))
    page.wait_for_timeout(500)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=60_000)


def test_100_mb_config_is_refused_before_it_reaches_the_server(
        page: Page, app: tuple[str, int], tmp_path: Path) -> None:
    url, pid = app
    big = tmp_path / "huge-config.json"
    with open(big, "wb") as fh:
        fh.truncate(100_000_000)  # sparse: costs no disk
    _open_custom_model(page, url)
    before = load_test.rss_bytes(pid)
    _upload(page, big)
    uploader = page.locator('[data-testid="stFileUploader"]').first.inner_text()
    assert "must be 1.0MB or smaller" in uploader, uploader
    assert load_test.rss_bytes(pid) - before < 20 * 2**20  # the 100 MB never arrived
    assert page.locator(EXCEPTION).count() == 0


@pytest.mark.parametrize(("name", "content", "says"), [
    ("deep.json", b"[" * 100_000 + b"]" * 100_000, "nested 100,000 levels deep"),
    ("pickled.json", pickle.dumps({"hidden_size": 4096}), "Could not use this config"),
    ("nan.json", b'{"num_hidden_layers": NaN}', "NaN is not a JSON number"),
], ids=["deep", "pickle", "nan"])
def test_hostile_config_through_the_file_chooser_gets_a_message(
        page: Page, app: tuple[str, int], tmp_path: Path, name: str, content: bytes,
        says: str) -> None:
    url, _ = app
    path = tmp_path / name
    path.write_bytes(content)
    _open_custom_model(page, url)
    _upload(page, path)
    page.locator(ALERT, has_text="Could not use this config").first.wait_for()
    alerts = " ".join(page.locator(ALERT).all_inner_texts())
    assert says in alerts, alerts
    assert page.locator(EXCEPTION).count() == 0
