"""Exposure: the server listens on localhost by default; on another address the GPU measurement
is switched off unless the user allows it (attnmem/measure/exposure.py, ATTNMEM_DISABLE_MEASURE)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from _robust import streamlit_server_option

from attnmem.measure.exposure import ENV, is_loopback, measurement_block_reason

pytestmark = pytest.mark.robustness

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "attnmem" / "pages" / "measure.py")


def test_default_config_listens_on_loopback_only() -> None:
    address = streamlit_server_option(ROOT, "address")
    assert isinstance(address, str) and is_loopback(address), address


@pytest.mark.parametrize(("address", "loop"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("LOCALHOST", True), ("0.0.0.0", False), ("::", False),
    ("192.168.1.5", False), ("", False), (None, False), ("my-host", False),
])
def test_is_loopback(address: str | None, loop: bool) -> None:
    assert is_loopback(address) is loop


@pytest.mark.parametrize(("setting", "address", "blocked"), [
    (None, "127.0.0.1", False),     # the default: local only, measuring allowed
    (None, "0.0.0.0", True),        # exposed: off unless allowed
    (None, None, True),             # Streamlit's own default is every interface
    ("1", "127.0.0.1", True),       # switched off explicitly
    ("true", "127.0.0.1", True),
    ("0", "0.0.0.0", False),        # allowed explicitly on a trusted network
    ("off", "0.0.0.0", False),
    ("maybe", "127.0.0.1", True),   # unclear: fail closed
    ("", "0.0.0.0", True),
])
def test_measurement_block_reason(setting: str | None, address: str | None,
                                  blocked: bool) -> None:
    env = {} if setting is None else {ENV: setting}
    reason = measurement_block_reason(env, address)
    assert (reason is not None) is blocked, reason
    if blocked:
        assert "switched off" in reason and (ENV in reason)


def test_reads_the_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "1")
    assert measurement_block_reason(address="127.0.0.1")
    monkeypatch.setenv(ENV, "0")
    assert measurement_block_reason(address="0.0.0.0") is None


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a socket listening on `port` (from /proc/net/tcp and tcp6)."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.rsplit(":", 1)
            if int(p, 16) == port and state == "0A":  # LISTEN
                if len(addr) == 8:
                    out.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr)[::-1]))
                else:
                    raw = bytes.fromhex(addr)
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    out.add(socket.inet_ntop(socket.AF_INET6, words))
    return out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
def test_started_server_listens_on_loopback_only() -> None:
    """`streamlit run app.py` with the repository's config (no address flag): only 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
         "--server.headless", "true", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health",
                                            timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.3)
        addresses = _listening_addresses(port)
        assert addresses and all(is_loopback(a) for a in addresses), addresses
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_measure_page_has_no_run_button_when_switched_off(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    import attnmem.measure.on_this_gpu
    import attnmem.measure.registry

    monkeypatch.setenv("ATTNMEM_DB", str(tmp_path / "r.sqlite"))
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setattr(attnmem.measure.registry, "gpu_reason", lambda: None)  # as on a GPU machine
    # the page asks on_this_gpu, which looks for a device node before torch
    monkeypatch.setattr(attnmem.measure.on_this_gpu, "gpu_reason", lambda: None)
    st.cache_resource.clear()
    try:
        at = AppTest.from_file(PAGE, default_timeout=180)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert not [b for b in at.button if b.label == "Run measurement"]
        shown = " ".join(str(e.value) for kind in ("info", "warning") for e in getattr(at, kind))
        assert "switched off" in shown, shown
    finally:
        st.cache_resource.clear()


@pytest.mark.slow
def test_measure_page_offers_a_run_when_allowed(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The control case of the test above: GPU present, local server, not switched off."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    import attnmem.measure.on_this_gpu
    import attnmem.measure.registry

    monkeypatch.setenv("ATTNMEM_DB", str(tmp_path / "r.sqlite"))
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(attnmem.measure.registry, "gpu_reason", lambda: None)
    # the page asks on_this_gpu, which looks for a device node before torch
    monkeypatch.setattr(attnmem.measure.on_this_gpu, "gpu_reason", lambda: None)
    st.cache_resource.clear()
    try:
        at = AppTest.from_file(PAGE, default_timeout=180)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert [b for b in at.button if b.label == "Run measurement"]
    finally:
        st.cache_resource.clear()
