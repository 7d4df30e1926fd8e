"""Load test: N concurrent sessions move inputs on the app for T seconds.

    .venv/bin/python scripts/load_test.py --sessions 20 --seconds 60            # 2 of them Chromium
    .venv/bin/python scripts/load_test.py --sessions 20 --browsers 20 --seconds 60   # all Chromium
    .venv/bin/python scripts/load_test.py --every-page --sessions 20 --seconds 60   # every page

With --every-page, 20 protocol sessions (no browser) each walk app.py's pages in turn, starting
one page apart: each opens a page by its script hash (as a click in the sidebar) and changes
up to three of its inputs (a number input moved by x2, /2, +1 or -1 within 1/8..8x its first value,
or one time in five a model or GPU picker: the first answer for a model read for the first
time), pausing about --think-s between moves. Reported per page: the script runs' median, p95
and max (opening and changing together, and each alone) and errors (an exception, a run that
did not finish, a run that drew no number and no message); targets: median 300 ms, p95 1 s.

Starts the app on a free port of 127.0.0.1 (or uses --url) and opens N sessions, each its own
Streamlit session over its own WebSocket:

- `--browsers` of them are headless pages in ONE Chromium (Debian's /usr/bin/chromium driven
  by Playwright, one browser context each): they change the heads number box or move the
  sequence-length slider with the keyboard on the score-matrix page and wait until the headline
  number shows the value attnmem.calc.score_matrix_bytes gives (latency: input -> right number drawn);
- the others speak Streamlit's WebSocket protocol directly (the protobuf BackMsg/ForwardMsg of
  the streamlit package, what the frontend sends when an input changes): they change the heads,
  the exact sequence length or the log-scale slider (one step) and read the page's deltas
  until the script run finishes
  (latency: input -> script run finished, checked against the same expected number). A browser
  costs a core's worth of drawing per page; 20 of them on a 2-core machine measure Chromium,
  not the app, so the default mixes 2 real pages with 18 protocol clients.

It records errors (Streamlit exception elements, browser console errors and failed loopback
requests, a number that did not update within --timeout-s or is wrong), the latencies (median,
p95, max) and the server's memory: VmRSS of the Streamlit process from /proc/<pid>/status
before the load, in the middle, at the end and after the sessions closed. A leak shows as
growth from the middle to the end: every session repeats the same kind of work, so caches
bounded by st.cache_data(max_entries=...) stop growing.

Each session pauses about --think-s seconds (default 1: uniformly 0.5 to 1.5 s) between two
moves, as a person does; --think-s 0 drives the server flat out (a throughput test). Sessions
open one after another and the clock starts once all show the app (opening is not
what is measured). Only loopback traffic; everything stops by itself (hard deadlines on opening
and on the run). Exit status 0 when there were no errors, the median latency (protocol clients,
else browsers) is within --budget-ms and the server grew by less than --max-growth-mb from the
middle to the end; else 1. Prints a summary and writes it as JSON with --json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from attnmem.calc import score_matrix_bytes  # noqa: E402
from attnmem.calc.units import format_bytes, short_len  # noqa: E402  (short_len: the sliders' labels)

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]
METRIC = '[data-testid="stMetricValue"]'
PAGE_PATH = "score_matrix"  # the page every session works on (app.py url_path)
EXCEPTION = '[data-testid="stException"]'
LOAD_TIMEOUT_S = 180  # opening a page while the others open (before the clock starts)
RAMP_S = 1.0  # sessions open one per second
THINK_S = 1.0  # mean pause of a session between two input changes (uniform 0.5x..1.5x)
S_STEPS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]  # the slider moves within these


# ----------------------------------------------------------------------- measurements ----

def rss_bytes(pid: int) -> int:
    """Resident set size of a process (VmRSS in /proc/<pid>/status), in bytes; 0 if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat), in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def parse_short_len(text: str) -> int:
    """'4K' -> 4096, '1M' -> 1048576, '128' -> 128."""
    mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(text.rstrip("KM").replace(",", "")) * mult


def nearest_pow2(n: int) -> int:
    """Nearest power of two in log scale, within the slider's 128 .. 2^24 (as the page does)."""
    if n <= 128:
        return 128
    if n >= 1 << 24:
        return 1 << 24
    below = 1 << (n.bit_length() - 1)
    return below if n / below <= 2 * below / n else 2 * below


def expected_text(batch: int, heads: int, seq_len: int) -> str:
    """The headline number of the score-matrix page (fp16, unit GB) for these inputs: MB or KB
    below 1 GB, as the page prints it (attnmem.pages.ui.units.fmt)."""
    return format_bytes(score_matrix_bytes(batch, heads, seq_len, "fp16"), "GB")


@dataclass
class SessionStats:
    index: int
    kind: str = "browser"  # "browser" (Chromium page) or "protocol" (WebSocket client)
    actions: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    external: set[str] = field(default_factory=set)  # off-machine URLs the page tried to load


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1") or not url.startswith("http")


def _on_console(stats: SessionStats, msg) -> None:
    if msg.type != "error":
        return
    where = (msg.location or {}).get("url", "")
    if "ERR_NAME_NOT_RESOLVED" in msg.text or (where and not is_loopback(where)):
        return  # an off-machine resource (fonts.gstatic.com icons) on a machine without internet
    if "404" in msg.text and urlsplit(where).path in (f"/{PAGE_PATH}/_stcore/health",
                                                      f"/{PAGE_PATH}/_stcore/host-config"):
        return  # Streamlit's frontend first tries a page's path as the app's base path
    stats.errors.append(f"console: {msg.text[:200]} ({where[:80]})")


def _on_request_failed(stats: SessionStats, request) -> None:
    if is_loopback(request.url):
        if not request.url.endswith("/favicon.ico"):
            stats.errors.append(f"request failed: {request.url[:120]} ({request.failure})")
    else:
        stats.external.add(urlsplit(request.url).hostname or request.url[:60])


@dataclass
class Report:
    sessions: int
    browsers: int
    seconds: float
    think_s: float
    actions: int
    errors: int
    error_samples: list[str]
    script_median_ms: float  # protocol clients: input change -> script run finished
    script_p95_ms: float
    script_max_ms: float
    browser_median_ms: float  # Chromium pages: input change -> right number drawn
    browser_p95_ms: float
    browser_max_ms: float
    rss_before_mb: float
    rss_mid_mb: float
    rss_end_mb: float
    rss_after_close_mb: float
    rss_peak_mb: float
    growth_mid_to_end_mb: float
    server_cpu_s: float
    wall_s: float
    cores: int
    load_avg: float
    external_hosts: list[str] = field(default_factory=list)
    ok: bool = False
    verdict: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------- the server ----

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def app_server(log_path: Path | None = None,
               extra_args: Sequence[str] = (),
               page_cpu: Path | None = None,
               script: Path | None = None) -> Iterator[tuple[str, int]]:
    """The app on a free 127.0.0.1 port: (url, pid); terminated at the end, whatever happens.

    extra_args are more `streamlit run` options (the browser test hides the toolbar). With
    page_cpu, the server counts each page's script CPU into that file (serve_counting_page_cpu).
    `script`: another Streamlit script to serve instead of app.py (scripts/settle_times.py's
    one-file floor apps), run from its own folder."""
    port = free_port()
    log = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115
    launch = ([sys.executable, str(Path(__file__).resolve()), "--serve-counting-page-cpu",
               str(page_cpu), "--"] if page_cpu else [sys.executable, "-m", "streamlit"])
    proc = subprocess.Popen(
        [*launch, "run", str(script) if script else "app.py", "--server.port", str(port),
         "--server.headless", "true", "--server.address", "127.0.0.1",
         "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
         *extra_args],
        cwd=script.parent if script else ROOT, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with code {proc.returncode} before serving")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("streamlit did not answer /_stcore/health within 90 s")
            time.sleep(0.3)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        if log is not subprocess.DEVNULL:
            log.close()


#: Signals to a server started with page_cpu: start counting afresh (the clock starts), and
#: write the counts now.
RESET_SIGNAL, DUMP_SIGNAL = signal.SIGUSR2, signal.SIGUSR1


def serve_counting_page_cpu(out: Path, streamlit_args: list[str]) -> int:
    """`streamlit <streamlit_args>` in this process, each page's script runs timed: the CPU
    time of the thread that runs it (time.thread_time around StreamlitPage.run, which runs the
    page's file inside app.py's run). RESET_SIGNAL empties the counts, DUMP_SIGNAL (and the
    exit) writes them to `out` as JSON {url path: [CPU seconds of each run]}. What a page costs
    the server's one Python process, whatever else runs on the machine (other jobs slow a run,
    they add little to its CPU time)."""
    import threading

    from streamlit.navigation.page import StreamlitPage
    from streamlit.web import cli

    runs: dict[str, list[float]] = {}
    lock = threading.Lock()
    original = StreamlitPage.run

    def timed_run(self: StreamlitPage) -> None:
        t0 = time.thread_time()
        try:
            original(self)
        finally:
            with lock:
                runs.setdefault(self.url_path or ROOT_PAGE, []).append(time.thread_time() - t0)

    def reset(*_: Any) -> None:
        with lock:
            runs.clear()

    def dump(*_: Any) -> None:
        with lock:
            text = json.dumps(runs)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(out)

    StreamlitPage.run = timed_run  # type: ignore[method-assign]
    signal.signal(RESET_SIGNAL, reset)
    signal.signal(DUMP_SIGNAL, dump)
    sys.argv = ["streamlit", *streamlit_args]
    try:
        return cli.main()
    finally:
        dump()


def read_page_cpu(pid: int, path: Path, timeout_s: float = 10) -> dict[str, list[float]]:
    """Ask the server started with page_cpu=path to write its counts; read them ({} if it did
    not answer in time)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    os.kill(pid, DUMP_SIGNAL)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with contextlib.suppress(FileNotFoundError, ValueError):
            return json.loads(path.read_text())
        time.sleep(0.1)
    return {}


# ----------------------------------------------------------------------- one session ----

async def _shown(page) -> str:
    return (await page.locator(METRIC).first.inner_text()).strip()


async def run_session(browser, url: str, index: int, seconds: float, timeout_s: float,
                      start_gate: asyncio.Event, ready: list[int], delay_s: float = 0.0,
                      think_s: float = THINK_S) -> SessionStats:
    stats = SessionStats(index)
    rng = random.Random(1000 + index)
    await asyncio.sleep(delay_s)  # ramp up: 20 renderers starting at once starve 2 cores
    ctx = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await ctx.new_page()
    page.set_default_timeout(timeout_s * 1000)
    page.on("console", lambda m: _on_console(stats, m))
    page.on("requestfailed", lambda r: _on_request_failed(stats, r))
    page.on("pageerror", lambda e: stats.errors.append(f"page error: {str(e)[:200]}"))
    batch, heads, s_idx = 1, 32, S_STEPS.index(4096)
    try:
        await page.goto(f"{url}/{PAGE_PATH}?b={batch}&h={heads}&s={S_STEPS[s_idx]}&dtype=fp16",
                        wait_until="domcontentloaded", timeout=LOAD_TIMEOUT_S * 1000)
        await page.wait_for_function(
            "t => { const e = document.querySelector('[data-testid=\"stMetricValue\"]');"
            " return e && e.innerText.trim() === t; }",
            arg=expected_text(batch, heads, S_STEPS[s_idx]), timeout=LOAD_TIMEOUT_S * 1000)
        heads_box = page.get_by_label("Attention heads H", exact=True).first
        slider = page.get_by_role("slider").first
        ready.append(index)
        await start_gate.wait()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            before = await _shown(page)
            if rng.random() < 0.5:  # the number input
                while True:
                    new_heads = rng.randint(1, 128)
                    if expected_text(batch, new_heads, S_STEPS[s_idx]) != before:
                        break
                heads = new_heads
                t0 = time.perf_counter()
                await heads_box.fill(str(heads))
                await heads_box.press("Enter")
            else:  # the log-scale slider, one step with the keyboard
                step = 1 if s_idx == 0 else -1 if s_idx == len(S_STEPS) - 1 else rng.choice((-1, 1))
                s_idx += step
                t0 = time.perf_counter()
                await slider.focus()
                await slider.press("ArrowRight" if step > 0 else "ArrowLeft")
            want = expected_text(batch, heads, S_STEPS[s_idx])
            try:
                await page.wait_for_function(
                    "t => { const e = document.querySelector('[data-testid=\"stMetricValue\"]');"
                    " return e && e.innerText.trim() === t; }",
                    arg=want, timeout=timeout_s * 1000, polling=10)
            except Exception:  # noqa: BLE001 - a timeout is an error of this action
                stats.errors.append(f"number did not become {want!r} within {timeout_s:g} s "
                                    f"(shows {await _shown(page)!r}; h={heads}, s={S_STEPS[s_idx]})")
                break
            stats.latencies_ms.append((time.perf_counter() - t0) * 1e3)
            stats.actions += 1
            await asyncio.sleep(rng.uniform(0.5, 1.5) * think_s)
            if await page.locator(EXCEPTION).count():
                stats.errors.append("exception: " + (await page.locator(EXCEPTION).first
                                                     .inner_text())[:300])
                break
    except Exception as exc:  # noqa: BLE001 - report, do not crash the other sessions
        stats.errors.append(f"session {index}: {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        await ctx.close()
    return stats


# ----------------------------------------------------------------------- a protocol session ----

class ProtocolSession:
    """A Streamlit session without a browser: Streamlit's own WebSocket protocol (protobuf
    BackMsg / ForwardMsg from the streamlit package) at /_stcore/stream, as the frontend
    speaks it. It sends what a browser sends when an input changes (a rerun with the widget's
    new value) and reads the page's deltas until the script run finishes: the latency is the
    server's script run plus the loopback round trip, without any drawing."""

    def __init__(self, url: str, stats: SessionStats, timeout_s: float) -> None:
        self.ws_url = url.replace("http://", "ws://", 1) + "/_stcore/stream"
        self.stats = stats
        self.timeout_s = timeout_s
        self.query = ""
        self.page_hash = ""
        self.widgets: dict[str, str] = {}  # label -> widget id
        self.slider_options: list[str] = []  # the log-scale slider's options as shown ("8K")
        self.metric = ""
        self.ws = None

    async def open(self, query: str) -> None:
        import websockets

        self.ws = await websockets.connect(self.ws_url, subprotocols=["streamlit"],
                                           max_size=2**26, open_timeout=LOAD_TIMEOUT_S)
        self.query = query
        await self.rerun({})

    async def rerun(self, values: dict[str, int | str]) -> None:
        from streamlit.proto.BackMsg_pb2 import BackMsg
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        msg = BackMsg()
        msg.rerun_script.query_string = self.query
        msg.rerun_script.page_script_hash = self.page_hash
        if not self.page_hash:  # the first run: the page by its URL path, as a browser asks
            msg.rerun_script.page_name = PAGE_PATH
        for label, value in values.items():
            w = msg.rerun_script.widget_states.widgets.add()
            w.id = self.widgets[label]
            if isinstance(value, str):  # a select_slider sends its option as shown
                w.string_array_value.data.append(value)
            else:
                w.int_value = value
        await self.ws.send(msg.SerializeToString())
        first_metric = None
        while True:
            raw = await asyncio.wait_for(self.ws.recv(), self.timeout_s)
            fwd = ForwardMsg()
            fwd.ParseFromString(raw)
            kind = fwd.WhichOneof("type")
            if kind == "new_session" and not self.page_hash:
                self.page_hash = fwd.new_session.page_script_hash
            elif kind == "navigation":  # the page the router chose, as the frontend keeps it
                self.page_hash = fwd.navigation.page_script_hash
            elif kind == "page_info_changed":
                self.query = fwd.page_info_changed.query_string
            elif kind == "delta" and fwd.delta.WhichOneof("type") == "new_element":
                el = fwd.delta.new_element
                et = el.WhichOneof("type")
                if et == "exception":
                    self.stats.errors.append(f"exception: {el.exception.message[:300]}")
                elif et == "number_input":
                    self.widgets[el.number_input.label] = el.number_input.id
                elif et == "slider":
                    self.widgets[el.slider.label] = el.slider.id
                    self.slider_options = list(el.slider.options)
                elif et == "metric" and first_metric is None:
                    first_metric = el.metric.body
            elif kind == "script_finished":
                if fwd.script_finished == 2:  # FINISHED_EARLY_FOR_RERUN: the rerun follows
                    continue
                if fwd.script_finished not in (0, 3):
                    self.stats.errors.append(f"script finished with status {fwd.script_finished}")
                break
        self.metric = (first_metric or "").strip()

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


async def run_protocol_session(url: str, index: int, seconds: float, timeout_s: float,
                               start_gate: asyncio.Event, ready: list[int], delay_s: float = 0.0,
                               think_s: float = THINK_S) -> SessionStats:
    stats = SessionStats(index, kind="protocol")
    rng = random.Random(1000 + index)
    await asyncio.sleep(delay_s)
    sess = ProtocolSession(url, stats, timeout_s)
    batch, heads, seq = 1, 32, 4096
    try:
        await sess.open(f"b={batch}&h={heads}&s={seq}&dtype=fp16")
        if sess.metric != expected_text(batch, heads, seq):
            stats.errors.append(f"first view shows {sess.metric!r}")
        ready.append(index)
        await start_gate.wait()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not stats.errors:
            if rng.random() < 0.5:
                heads = rng.randint(1, 128)
                change = {"Attention heads H": heads}
            elif rng.random() < 0.5:  # the exact sequence-length box (the slider follows it)
                seq = rng.choice(S_STEPS) + rng.randint(0, 999)
                change = {"exact": seq}
            else:  # the log-scale slider, one step from where it is
                here = short_len(nearest_pow2(seq))
                i = sess.slider_options.index(here)
                j = i + (1 if i == 0 else -1 if i == len(sess.slider_options) - 1
                         else rng.choice((-1, 1)))
                seq = parse_short_len(sess.slider_options[j])
                label = next(k for k in sess.widgets if k.startswith("Sequence length s"))
                change = {label: sess.slider_options[j]}
            t0 = time.perf_counter()
            await sess.rerun(change)
            stats.latencies_ms.append((time.perf_counter() - t0) * 1e3)
            stats.actions += 1
            want = expected_text(batch, heads, seq)
            if sess.metric != want:
                stats.errors.append(f"shows {sess.metric!r}, expected {want!r} "
                                    f"(h={heads}, s={seq})")
            await asyncio.sleep(rng.uniform(0.5, 1.5) * think_s)  # a person pauses between moves
    except Exception as exc:  # noqa: BLE001 - report, do not crash the other sessions
        stats.errors.append(f"protocol session {index}: {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        await sess.close()
    return stats


# ----------------------------------------------------------------------- the run ----

async def _load(url: str, pid: int, sessions: int, seconds: float, timeout_s: float,
                browsers: int, think_s: float) -> tuple[list[SessionStats], dict[str, float]]:
    from playwright.async_api import async_playwright

    exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if not exe:
        raise RuntimeError(f"{CHROMIUM} is missing (apt-get install chromium)")
    mem: dict[str, float] = {}
    samples: list[int] = []
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=exe, args=LAUNCH_ARGS)
        try:
            gate = asyncio.Event()
            ready: list[int] = []
            tasks = [asyncio.create_task(
                run_session(browser, url, i, seconds, timeout_s, gate, ready, i * RAMP_S,
                            think_s))
                for i in range(browsers)]
            tasks += [asyncio.create_task(run_protocol_session(
                url, i, seconds, timeout_s, gate, ready, (i - browsers) * 0.2, think_s))
                for i in range(browsers, sessions)]
            # every page loaded (or failed) before the clock starts; bounded wait
            t_load = time.monotonic()
            while time.monotonic() - t_load < LOAD_TIMEOUT_S + sessions * RAMP_S:
                await asyncio.sleep(0.1)
                if len(ready) + sum(1 for t in tasks if t.done()) >= sessions:
                    break
            mem["load_s"] = time.monotonic() - t_load
            mem["before"] = rss_bytes(pid)
            gate.set()
            t_start = time.monotonic()
            while not all(t.done() for t in tasks):
                await asyncio.sleep(0.5)
                samples.append(rss_bytes(pid))
                if "mid" not in mem and time.monotonic() - t_start >= seconds / 2:
                    mem["mid"] = rss_bytes(pid)
                if time.monotonic() - t_start > seconds + LOAD_TIMEOUT_S:
                    for t in tasks:
                        t.cancel()
                    break
                if "end" not in mem and time.monotonic() - t_start >= seconds:
                    mem["end"] = rss_bytes(pid)
            results = []
            for t in tasks:
                try:
                    results.append(await t)
                except asyncio.CancelledError:
                    results.append(SessionStats(-1, errors=["cancelled at the hard deadline"]))
        finally:
            await browser.close()
    mem.setdefault("mid", mem.get("before", 0))
    mem.setdefault("end", samples[-1] if samples else 0)
    mem["peak"] = max(samples or [0])
    return results, mem


def _stats(lat: list[float]) -> tuple[float, float, float]:
    if not lat:
        return float("nan"), float("nan"), float("nan")
    return (round(statistics.median(lat), 1), round(percentile(lat, 95), 1),
            round(max(lat), 1))


def run(sessions: int, seconds: float, url: str | None = None, timeout_s: float = 30.0,
        budget_ms: float = 1000.0, max_growth_mb: float = 64.0,
        log_path: Path | None = None, browsers: int | None = None,
        think_s: float = THINK_S) -> Report:
    """Run the load test (module docstring) and return its report. `browsers` of the sessions
    are Chromium pages (default: all), the rest protocol sessions."""
    browsers = sessions if browsers is None else max(0, min(browsers, sessions))
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        if url is None:
            url, pid = stack.enter_context(app_server(log_path))
        else:
            pid = 0
        cpu0 = cpu_seconds(pid) if pid else 0.0
        results, mem = asyncio.run(_load(url, pid, sessions, seconds, timeout_s, browsers,
                                         think_s))
        time.sleep(5)  # sessions closed: let the server drop them
        after = rss_bytes(pid) if pid else 0
        cpu = (cpu_seconds(pid) - cpu0) if pid else 0.0
    proto = [x for r in results if r.kind == "protocol" for x in r.latencies_ms]
    shown = [x for r in results if r.kind == "browser" for x in r.latencies_ms]
    errors = [e for r in results for e in r.errors]
    mb = 1 / 2**20
    pm, pp, px = _stats(proto)
    bm, bp, bx = _stats(shown)
    rep = Report(
        sessions=sessions, browsers=browsers, seconds=seconds, think_s=think_s,
        actions=sum(r.actions for r in results),
        errors=len(errors), error_samples=errors[:10],
        script_median_ms=pm, script_p95_ms=pp, script_max_ms=px,
        browser_median_ms=bm, browser_p95_ms=bp, browser_max_ms=bx,
        rss_before_mb=round(mem["before"] * mb, 1), rss_mid_mb=round(mem["mid"] * mb, 1),
        rss_end_mb=round(mem["end"] * mb, 1), rss_after_close_mb=round(after * mb, 1),
        rss_peak_mb=round(mem["peak"] * mb, 1),
        growth_mid_to_end_mb=round((mem["end"] - mem["mid"]) * mb, 1),
        server_cpu_s=round(cpu, 1), wall_s=round(time.monotonic() - t0, 1),
        cores=os.cpu_count() or 0, load_avg=round(os.getloadavg()[0], 1),
        external_hosts=sorted({h for r in results for h in r.external}))
    if rep.errors:
        rep.verdict.append(f"{rep.errors} error(s)")
    gated = proto or shown
    median = statistics.median(gated) if gated else float("nan")
    if not gated:
        rep.verdict.append("no action completed")
    elif median > budget_ms:
        what = "script run (protocol sessions)" if proto else "input -> number on screen"
        rep.verdict.append(f"median {what} {median:.0f} ms > budget {budget_ms:g} ms")
    if pid and rep.growth_mid_to_end_mb > max_growth_mb:
        rep.verdict.append(f"server grew {rep.growth_mid_to_end_mb} MB from the middle to the "
                           f"end (> {max_growth_mb} MB)")
    rep.ok = not rep.verdict
    return rep


def summary(rep: Report) -> str:
    lines = [f"{rep.sessions} sessions ({rep.browsers} Chromium pages, "
             f"{rep.sessions - rep.browsers} protocol clients) x {rep.seconds:g} s on "
             f"{rep.cores} cores, pauses of ~{rep.think_s:g} s between moves: {rep.actions} "
             f"input changes ({rep.actions / rep.seconds:.1f}/s), {rep.errors} errors"]
    if rep.sessions > rep.browsers:
        lines.append(f"input change -> script run finished (protocol clients): median "
                     f"{rep.script_median_ms} ms, p95 {rep.script_p95_ms} ms, "
                     f"max {rep.script_max_ms} ms")
    if rep.browsers:
        lines.append(f"input change -> right number drawn (Chromium pages): median "
                     f"{rep.browser_median_ms} ms, p95 {rep.browser_p95_ms} ms, "
                     f"max {rep.browser_max_ms} ms")
    lines.append(
        f"server RSS: before {rep.rss_before_mb} MB, middle {rep.rss_mid_mb} MB, end "
        f"{rep.rss_end_mb} MB, peak {rep.rss_peak_mb} MB, 5 s after the sessions closed "
        f"{rep.rss_after_close_mb} MB (middle -> end {rep.growth_mid_to_end_mb:+} MB); server "
        f"CPU {rep.server_cpu_s} s in {rep.wall_s} s wall; load average {rep.load_avg}")
    if rep.external_hosts:
        lines.append("(not errors: the pages asked for off-machine resources from "
                     + ", ".join(rep.external_hosts) + ")")
    lines.append("PASS" if rep.ok else "FAIL: " + "; ".join(rep.verdict))
    lines += [f"  {e}" for e in rep.error_samples]
    return "\n".join(lines)


# ----------------------------------------------------------------------- every page ----
# `--every-page`: protocol sessions that walk all pages of app.py (issue 45, item 5).

#: The default page's url_path in app.py (it is served at "/").
ROOT_PAGE = "home"
#: Options of a model picker that need more input (a Hub id, a file): not picked at random.
NOT_PICKED = ("Hub", "config.json", "Custom")


def every_page_paths() -> list[str]:
    """Every page's url_path in app.py's order (the default page as "home": its url_path)."""
    import re

    found = re.findall(r'st\.Page\(\s*"attnmem/pages/\w+\.py"[^)]*url_path="([^"]+)"',
                       (ROOT / "app.py").read_text())
    if not found:
        raise SystemExit("app.py lists no st.Page with a url_path")
    return found


@dataclass
class PageStats:
    """One page's figures over every session: script runs after opening it (`opens`) and after
    an input change (`changes`), in ms, and the errors seen there."""

    opens_ms: list[float] = field(default_factory=list)
    changes_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class PageWalker:
    """A protocol session (ProtocolSession's wire format) that opens pages by their script hash,
    as a click in the sidebar does, and changes their number inputs and model and GPU pickers.
    After every run the page must have answered: a number (st.metric) or a message."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.ws_url = url.replace("http://", "ws://", 1) + "/_stcore/stream"
        self.timeout_s = timeout_s
        self.ws = None
        self.query = ""
        self.page_hash = ""
        self.hashes: dict[str, str] = {}  # url path -> page script hash (the navigation message)
        self.numbers: dict[str, Any] = {}  # label -> NumberInput proto, of the page last run
        self.selects: dict[str, Any] = {}  # label -> Selectbox proto (model and GPU pickers)
        self.values: dict[str, float] = {}  # widget id -> the value this session last sent
        self.first: dict[str, float] = {}  # widget id -> its value when first seen

    async def connect(self) -> None:
        import websockets

        self.ws = await websockets.connect(self.ws_url, subprotocols=["streamlit"],
                                           max_size=2**26, open_timeout=LOAD_TIMEOUT_S)

    async def run(self, page: str | None, change: tuple[Any, Any] | None) -> list[str]:
        """One script run: open `page` (a url path) or apply `change` (proto, value) on the page
        shown; the errors it showed (an exception, a bad end, no answer)."""
        from streamlit.proto.BackMsg_pb2 import BackMsg
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        msg = BackMsg()
        if page is not None:
            self.query = ""
            if page in self.hashes:
                msg.rerun_script.page_script_hash = self.hashes[page]
            msg.rerun_script.page_name = page
        else:
            msg.rerun_script.page_script_hash = self.page_hash
        msg.rerun_script.query_string = self.query
        if change is not None:
            proto, value = change
            w = msg.rerun_script.widget_states.widgets.add()
            w.id = proto.id
            if isinstance(value, str):
                w.string_value = value
            elif proto.data_type == proto.INT:
                w.int_value = int(value)
            else:
                w.double_value = float(value)
            self.values[proto.id] = value
        await self.ws.send(msg.SerializeToString())
        errors: list[str] = []
        answered = False
        numbers: dict[str, Any] = {}
        selects: dict[str, Any] = {}
        while True:
            fwd = ForwardMsg()
            fwd.ParseFromString(await asyncio.wait_for(self.ws.recv(), self.timeout_s))
            kind = fwd.WhichOneof("type")
            if kind == "new_session" and not self.page_hash:
                self.page_hash = fwd.new_session.page_script_hash
            elif kind == "navigation":
                self.page_hash = fwd.navigation.page_script_hash
                for p in fwd.navigation.app_pages:  # the default page by its url_path too
                    self.hashes[p.url_pathname.strip("/")] = p.page_script_hash
                    if p.is_default:
                        self.hashes[ROOT_PAGE] = p.page_script_hash
            elif kind == "page_info_changed":
                self.query = fwd.page_info_changed.query_string
            elif kind == "delta" and fwd.delta.WhichOneof("type") == "new_element":
                el = fwd.delta.new_element
                et = el.WhichOneof("type")
                if et == "exception":
                    errors.append(f"exception: {el.exception.message[:200]}")
                elif et in ("metric", "alert"):
                    answered = True
                elif et == "number_input" and not el.number_input.disabled:
                    numbers[el.number_input.label] = el.number_input
                elif et == "selectbox" and not el.selectbox.disabled and any(
                        w in el.selectbox.label for w in ("Model", "GPU")):
                    selects[el.selectbox.label] = el.selectbox
            elif kind == "script_finished":
                if fwd.script_finished == 2:  # FINISHED_EARLY_FOR_RERUN: the rerun follows
                    numbers, selects, answered = {}, {}, False
                    continue
                if fwd.script_finished not in (0, 3):
                    errors.append(f"script finished with status {fwd.script_finished}")
                break
        self.numbers, self.selects = numbers, selects
        if not answered and not errors:
            errors.append("no number and no message drawn")
        return errors

    def pick_change(self, rng: random.Random) -> tuple[Any, Any] | None:
        """A new value for one input of the page shown: a model or GPU picker (one time in
        five where the page has one: a model read for the first time), else a number input
        moved by x2, /2, +1 or -1 within its bounds and 1/8..8x its first value."""
        if self.selects and rng.random() < 0.2:
            proto = rng.choice(list(self.selects.values()))
            options = [o for o in proto.options if not any(w in o for w in NOT_PICKED)]
            if options:
                return proto, rng.choice(options)
        protos = list(self.numbers.values())
        rng.shuffle(protos)
        for proto in protos:
            shown = proto.value if proto.set_value else proto.default  # the page's value
            first = self.first.setdefault(proto.id, shown)  # as the session first saw it
            now = self.values.get(proto.id, shown)
            lo = max(proto.min if proto.has_min else -1e18, first / 8 if first > 0 else first)
            hi = min(proto.max if proto.has_max else 1e18, max(first * 8, first + 8))
            ops = ["x2", "/2", "+1", "-1"]
            rng.shuffle(ops)
            for op in ops:
                new = {"x2": now * 2, "/2": now / 2, "+1": now + 1, "-1": now - 1}[op]
                new = round(new) if proto.data_type == proto.INT else new
                if lo <= new <= hi and new != now:
                    return proto, new
        return None

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


async def walk_pages(url: str, index: int, paths: list[str], seconds: float, timeout_s: float,
                     start_gate: asyncio.Event, ready: list[int], stats: dict[str, PageStats],
                     delay_s: float, think_s: float, changes_per_page: int = 3) -> int:
    """One session: from page `index` on, each page opened in turn and `changes_per_page`
    inputs changed there, until `seconds` have passed; the number of runs."""
    rng = random.Random(2000 + index)
    await asyncio.sleep(delay_s)
    walker = PageWalker(url, timeout_s)
    runs = 0
    i = index % len(paths)
    try:
        await walker.connect()
        await walker.run(paths[i], None)  # the session's first page, before the clock
        ready.append(index)
        await start_gate.wait()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            i = (i + 1) % len(paths)
            page = paths[i]
            t0 = time.perf_counter()
            errs = await walker.run(page, None)
            stats[page].opens_ms.append((time.perf_counter() - t0) * 1e3)
            stats[page].errors += [f"open: {e}" for e in errs]
            runs += 1
            for _ in range(changes_per_page):
                if time.monotonic() >= deadline:
                    break
                await asyncio.sleep(rng.uniform(0.5, 1.5) * think_s)
                change = walker.pick_change(rng)
                if change is None:
                    break
                t0 = time.perf_counter()
                errs = await walker.run(None, change)
                stats[page].changes_ms.append((time.perf_counter() - t0) * 1e3)
                stats[page].errors += [f"{change[0].label} = {change[1]!r}: {e}" for e in errs]
                runs += 1
            await asyncio.sleep(rng.uniform(0.5, 1.5) * think_s)
    except Exception as exc:  # noqa: BLE001 - report, do not crash the other sessions
        stats[paths[i]].errors.append(f"session {index}: {type(exc).__name__}: {str(exc)[:200]}")
    finally:
        await walker.close()
    return runs


async def _every_page(url: str, sessions: int, seconds: float, timeout_s: float, think_s: float,
                      paths: list[str], pid: int | None = None,
                      cpu: dict[str, Any] | None = None,
                      page_cpu: Path | None = None) -> dict[str, PageStats]:
    """Every session's page walk; with the server's `pid`, `cpu` gets its CPU seconds over the
    timed part (from the gate to the last session's end) as cpu["server_s"], and with
    `page_cpu` (the server counts each page's script CPU there) cpu["pages"]: those counts
    over the timed part."""
    stats = {p: PageStats() for p in paths}
    gate = asyncio.Event()
    ready: list[int] = []
    tasks = [asyncio.create_task(walk_pages(url, i, paths, seconds, timeout_s, gate, ready,
                                            stats, i * 0.3, think_s)) for i in range(sessions)]
    t_load = time.monotonic()
    while time.monotonic() - t_load < LOAD_TIMEOUT_S + sessions:
        await asyncio.sleep(0.1)
        if len(ready) + sum(1 for t in tasks if t.done()) >= sessions:
            break
    cpu0 = cpu_seconds(pid) if pid else 0.0
    if cpu is not None:  # the machine's load when the clock starts (other jobs, not this test)
        cpu["load_start"] = os.getloadavg()[0]
    if pid and page_cpu:
        os.kill(pid, RESET_SIGNAL)
    gate.set()
    done, pending = await asyncio.wait(tasks, timeout=seconds + LOAD_TIMEOUT_S)
    if cpu is not None:
        cpu["load_end"] = os.getloadavg()[0]
    if pid and cpu is not None:
        cpu["server_s"] = cpu_seconds(pid) - cpu0
        if page_cpu:
            cpu["pages"] = read_page_cpu(pid, page_cpu)
    for t in pending:
        t.cancel()
        stats[paths[0]].errors.append("a session was cancelled at the hard deadline")
    return stats


def every_page(sessions: int, seconds: float, url: str | None = None, timeout_s: float = 30.0,
               think_s: float = THINK_S, median_ms: float = 300, p95_ms: float = 1000,
               server: dict[str, Any] | None = None) -> tuple[dict[str, dict[str, Any]], bool]:
    """Per page: runs, median and p95 (ms) of the script runs (opening it and changing its
    inputs together), the same for each kind, and its errors; and whether every page is
    within the targets (no errors, median <= median_ms, p95 <= p95_ms). With the app started
    here (no `url`), `server` gets the server's CPU seconds over the timed part, the runs and
    the CPU per run: the figure that load on the machine from elsewhere changes least."""
    paths = every_page_paths()
    cpu: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        pid = None
        page_cpu = None
        if url is None:
            page_cpu = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "page_cpu.json"
            url, pid = stack.enter_context(app_server(page_cpu=page_cpu))
        stats = asyncio.run(_every_page(url, sessions, seconds, timeout_s, think_s, paths, pid,
                                        cpu, page_cpu))
    out: dict[str, dict[str, Any]] = {}
    ok = True
    for page, s in stats.items():
        both = s.opens_ms + s.changes_ms
        med, p95, mx = _stats(both)
        row = {"runs": len(both), "median_ms": med, "p95_ms": p95, "max_ms": mx,
               "open_median_ms": _stats(s.opens_ms)[0], "change_median_ms": _stats(s.changes_ms)[0],
               "errors": len(s.errors), "error_samples": s.errors[:5]}
        row["ok"] = bool(both) and not s.errors and med <= median_ms and p95 <= p95_ms
        ok &= row["ok"]
        secs = cpu.get("pages", {}).get(page, [])
        if secs:  # the page's script CPU per run (its runs as the server counted them)
            row.update(cpu_mean_ms=round(1e3 * statistics.mean(secs), 1),
                       cpu_median_ms=round(1e3 * statistics.median(secs), 1),
                       cpu_p95_ms=round(1e3 * percentile(secs, 95), 1))
        out[page] = row
    if server is not None:
        server.update(load_start=round(cpu.get("load_start", float("nan")), 2),
                      load_end=round(cpu.get("load_end", float("nan")), 2))
    if "server_s" in cpu and server is not None:  # CPU per script run, whatever else loads the machine
        runs = sum(r["runs"] for r in out.values())
        server.update(cpu_s=round(cpu["server_s"], 1), runs=runs,
                      cpu_ms_per_run=round(1e3 * cpu["server_s"] / max(1, runs), 1))
    return out, ok


def every_page_summary(rows: dict[str, dict[str, Any]], sessions: int, seconds: float,
                       server: dict[str, Any] | None = None) -> str:
    load = (f"{server['load_start']:.1f} at the start, {server['load_end']:.1f} at the end"
            if server and "load_start" in server else f"{os.getloadavg()[0]:.1f} at the end")
    lines = [f"{sessions} protocol sessions x {seconds:g} s walking every page on "
             f"{os.cpu_count()} cores (1-minute load average {load}); "
             "script run after opening a page or changing an input, ms:",
             f"{'page':<16}{'runs':>6}{'median':>9}{'p95':>9}{'max':>9}{'open med':>10}"
             f"{'change med':>12}{'errors':>8}{'CPU mean':>10}{'CPU med':>9}"]
    for page, r in rows.items():
        lines.append(f"{page:<16}{r['runs']:>6}{r['median_ms']:>9}{r['p95_ms']:>9}{r['max_ms']:>9}"
                     f"{r['open_median_ms']:>10}{r['change_median_ms']:>12}{r['errors']:>8}"
                     f"{r.get('cpu_mean_ms', float('nan')):>10}{r.get('cpu_median_ms', float('nan')):>9}"
                     + ("" if r["ok"] else "  over target" if not r["errors"] else "  ERRORS"))
    if server and "cpu_s" in server:
        lines.append(f"server CPU over the timed part: {server['cpu_s']} s for {server['runs']} "
                     f"runs, {server['cpu_ms_per_run']} ms per run (its one Python process "
                     "runs every session's script under one GIL); CPU mean / med: each page's "
                     "script (the server's thread time in the page's file), ms per run")
    for page, r in rows.items():
        lines += [f"  {page}: {e}" for e in r["error_samples"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-counting-page-cpu"]:  # app_server(page_cpu=...) starts this
        return serve_counting_page_cpu(Path(argv[1]), argv[3:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=20, help="concurrent sessions (20)")
    ap.add_argument("--browsers", type=int, default=2,
                    help="how many of them are Chromium pages; the rest speak Streamlit's "
                         "WebSocket protocol directly (2; --browsers 20 for all-browser)")
    ap.add_argument("--seconds", type=float, default=60, help="how long each session works (60)")
    ap.add_argument("--url", default=None, help="use a running app instead of starting one "
                    "(no server memory figures then)")
    ap.add_argument("--timeout-s", type=float, default=30, help="longest wait for one update")
    ap.add_argument("--think-s", type=float, default=THINK_S,
                    help="mean pause between two moves of one session (1.0; 0 = flat out)")
    ap.add_argument("--budget-ms", type=float, default=1000,
                    help="median latency budget under this load (1000)")
    ap.add_argument("--max-growth-mb", type=float, default=64,
                    help="allowed server RSS growth from the middle to the end (64)")
    ap.add_argument("--json", type=Path, default=None, help="write the report here as JSON")
    ap.add_argument("--log", type=Path, default=None, help="the server's output goes here")
    ap.add_argument("--every-page", action="store_true",
                    help="protocol sessions that walk every page of app.py, changing number "
                         "inputs and the model and GPU pickers: per page median and p95 of the "
                         "script runs (targets 300 ms / 1 s) and errors")
    args = ap.parse_args(argv)
    if not 1 <= args.sessions <= 64 or not 1 <= args.seconds <= 3600:
        ap.error("--sessions must be 1..64 and --seconds 1..3600")
    if args.url and not args.url.startswith(("http://127.0.0.1", "http://localhost")):
        ap.error("--url must be a loopback address (http://127.0.0.1:PORT)")
    if args.every_page:
        server: dict[str, Any] = {}
        rows, ok = every_page(args.sessions, args.seconds, args.url, args.timeout_s, args.think_s,
                              server=server)
        print(every_page_summary(rows, args.sessions, args.seconds, server))
        print("PASS" if ok else "FAIL")
        if args.json:
            args.json.write_text(json.dumps({"pages": rows, "server": server}, indent=2) + "\n")
        return 0 if ok else 1
    rep = run(args.sessions, args.seconds, args.url, args.timeout_s, args.budget_ms,
              args.max_growth_mb, args.log, args.browsers, args.think_s)
    print(summary(rep))
    if args.json:
        args.json.write_text(json.dumps(asdict(rep), indent=2) + "\n")
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
