"""Load test: N concurrent browser sessions move inputs on the app for T seconds.

    .venv/bin/python scripts/load_test.py --sessions 20 --seconds 60

Starts the app on a free port of 127.0.0.1 (or uses --url), opens N headless pages in ONE
Chromium (Debian's /usr/bin/chromium driven by Playwright, each page in its own browser
context, so each is its own Streamlit session over its own WebSocket), and in every session,
until the time is up: changes the heads number box or moves the sequence-length slider one
step with the keyboard on the score-matrix page, then waits until the headline number shows
the value calc.score_matrix_bytes gives for the new inputs. It records

- errors: Streamlit exception boxes, browser console errors, page errors, a number that did
  not update within --timeout-s, or a wrong number;
- latency: time from the input change until the right number is on screen (median, p95, max):
  what a user waits; it includes the page script run, the WebSocket round trip and the
  browser's drawing of the chart, all sharing the machine's cores with N browser pages;
- server memory: VmRSS of the Streamlit process from /proc/<pid>/status before the load, in
  the middle, at the end and after the sessions closed (a leak shows as growth from the middle
  to the end: every session repeats the same kind of work, so caches bounded by
  st.cache_data(max_entries=...) stop growing).

Sessions open one per second and the clock starts once all are showing the app (opening 20
renderers at once starves a 2-core machine; opening is not what is measured). Only loopback
traffic; everything stops by itself (hard deadlines on opening and on the run). Exit
status 0 when there were no errors, the median latency is within --budget-ms and the server
grew by less than --max-growth-mb from the middle to the end of the load; else 1.
Prints a summary and writes it as JSON with --json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from calc import format_gb, score_matrix_bytes  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]
METRIC = '[data-testid="stMetricValue"]'
EXCEPTION = '[data-testid="stException"]'
LOAD_TIMEOUT_S = 180  # opening a page while the others open (before the clock starts)
RAMP_S = 1.0  # sessions open one per second
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


def expected_text(batch: int, heads: int, seq_len: int) -> str:
    """The headline number of the score-matrix page (fp16, unit GB) for these inputs."""
    return format_gb(score_matrix_bytes(batch, heads, seq_len, "fp16"))


@dataclass
class SessionStats:
    index: int
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
    seconds: float
    actions: int
    errors: int
    error_samples: list[str]
    latency_median_ms: float
    latency_p95_ms: float
    latency_max_ms: float
    rss_before_mb: float
    rss_mid_mb: float
    rss_end_mb: float
    rss_after_close_mb: float
    rss_peak_mb: float
    growth_mid_to_end_mb: float
    server_cpu_s: float
    wall_s: float
    cores: int
    external_hosts: list[str] = field(default_factory=list)
    ok: bool = False
    verdict: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------- the server ----

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def app_server(log_path: Path | None = None) -> Iterator[tuple[str, int]]:
    """The app on a free 127.0.0.1 port: (url, pid); terminated at the end, whatever happens."""
    port = free_port()
    log = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
         "--server.headless", "true", "--server.address", "127.0.0.1",
         "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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


# ----------------------------------------------------------------------- one session ----

async def _shown(page) -> str:
    return (await page.locator(METRIC).first.inner_text()).strip()


async def run_session(browser, url: str, index: int, seconds: float, timeout_s: float,
                      start_gate: asyncio.Event, ready: list[int], delay_s: float = 0.0
                      ) -> SessionStats:
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
        await page.goto(f"{url}/?b={batch}&h={heads}&s={S_STEPS[s_idx]}&dtype=fp16",
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
            if await page.locator(EXCEPTION).count():
                stats.errors.append("exception: " + (await page.locator(EXCEPTION).first
                                                     .inner_text())[:300])
                break
    except Exception as exc:  # noqa: BLE001 - report, do not crash the other sessions
        stats.errors.append(f"session {index}: {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        await ctx.close()
    return stats


# ----------------------------------------------------------------------- the run ----

async def _load(url: str, pid: int, sessions: int, seconds: float, timeout_s: float) -> tuple[
        list[SessionStats], dict[str, float]]:
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
                run_session(browser, url, i, seconds, timeout_s, gate, ready, i * RAMP_S))
                for i in range(sessions)]
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


def run(sessions: int, seconds: float, url: str | None = None, timeout_s: float = 30.0,
        budget_ms: float = 1000.0, max_growth_mb: float = 64.0,
        log_path: Path | None = None) -> Report:
    """Run the load test (module docstring) and return its report."""
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        if url is None:
            url, pid = stack.enter_context(app_server(log_path))
        else:
            pid = 0
        cpu0 = cpu_seconds(pid) if pid else 0.0
        results, mem = asyncio.run(_load(url, pid, sessions, seconds, timeout_s))
        time.sleep(5)  # sessions closed: let the server drop them
        after = rss_bytes(pid) if pid else 0
        cpu = (cpu_seconds(pid) - cpu0) if pid else 0.0
    lat = [x for r in results for x in r.latencies_ms]
    errors = [e for r in results for e in r.errors]
    mb = 1 / 2**20
    rep = Report(
        sessions=sessions, seconds=seconds, actions=sum(r.actions for r in results),
        errors=len(errors), error_samples=errors[:10],
        latency_median_ms=round(statistics.median(lat), 1) if lat else float("nan"),
        latency_p95_ms=round(percentile(lat, 95), 1), latency_max_ms=round(max(lat or [0]), 1),
        rss_before_mb=round(mem["before"] * mb, 1), rss_mid_mb=round(mem["mid"] * mb, 1),
        rss_end_mb=round(mem["end"] * mb, 1), rss_after_close_mb=round(after * mb, 1),
        rss_peak_mb=round(mem["peak"] * mb, 1),
        growth_mid_to_end_mb=round((mem["end"] - mem["mid"]) * mb, 1),
        server_cpu_s=round(cpu, 1), wall_s=round(time.monotonic() - t0, 1),
        cores=os.cpu_count() or 0,
        external_hosts=sorted({h for r in results for h in r.external}))
    if rep.errors:
        rep.verdict.append(f"{rep.errors} error(s)")
    if not lat:
        rep.verdict.append("no action completed")
    elif rep.latency_median_ms > budget_ms:
        rep.verdict.append(f"median latency {rep.latency_median_ms} ms > budget {budget_ms} ms")
    if pid and rep.growth_mid_to_end_mb > max_growth_mb:
        rep.verdict.append(f"server grew {rep.growth_mid_to_end_mb} MB from the middle to the "
                           f"end (> {max_growth_mb} MB)")
    rep.ok = not rep.verdict
    return rep


def summary(rep: Report) -> str:
    return (
        f"{rep.sessions} sessions x {rep.seconds:g} s on {rep.cores} cores: {rep.actions} input "
        f"changes, {rep.errors} errors\n"
        f"latency input -> right number on screen: median {rep.latency_median_ms} ms, "
        f"p95 {rep.latency_p95_ms} ms, max {rep.latency_max_ms} ms\n"
        f"server RSS: before {rep.rss_before_mb} MB, middle {rep.rss_mid_mb} MB, end "
        f"{rep.rss_end_mb} MB, peak {rep.rss_peak_mb} MB, 5 s after the sessions closed "
        f"{rep.rss_after_close_mb} MB (middle -> end {rep.growth_mid_to_end_mb:+} MB); server CPU "
        f"{rep.server_cpu_s} s in {rep.wall_s} s wall\n"
        + (f"(not errors: the pages asked for off-machine resources from "
           f"{', '.join(rep.external_hosts)})\n" if rep.external_hosts else "")
        + ("PASS" if rep.ok else "FAIL: " + "; ".join(rep.verdict))
        + ("".join(f"\n  {e}" for e in rep.error_samples) if rep.error_samples else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=20, help="concurrent browser sessions (20)")
    ap.add_argument("--seconds", type=float, default=60, help="how long each session works (60)")
    ap.add_argument("--url", default=None, help="use a running app instead of starting one "
                    "(no server memory figures then)")
    ap.add_argument("--timeout-s", type=float, default=30, help="longest wait for one update")
    ap.add_argument("--budget-ms", type=float, default=1000,
                    help="median latency budget under this load (1000)")
    ap.add_argument("--max-growth-mb", type=float, default=64,
                    help="allowed server RSS growth from the middle to the end (64)")
    ap.add_argument("--json", type=Path, default=None, help="write the report here as JSON")
    ap.add_argument("--log", type=Path, default=None, help="the server's output goes here")
    args = ap.parse_args(argv)
    if not 1 <= args.sessions <= 64 or not 1 <= args.seconds <= 3600:
        ap.error("--sessions must be 1..64 and --seconds 1..3600")
    if args.url and not args.url.startswith(("http://127.0.0.1", "http://localhost")):
        ap.error("--url must be a loopback address (http://127.0.0.1:PORT)")
    rep = run(args.sessions, args.seconds, args.url, args.timeout_s, args.budget_ms,
              args.max_growth_mb, args.log)
    print(summary(rep))
    if args.json:
        args.json.write_text(json.dumps(asdict(rep), indent=2) + "\n")
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
