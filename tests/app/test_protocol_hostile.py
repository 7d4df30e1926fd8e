"""A hostile client on Streamlit's WebSocket protocol: what a script (not the app's frontend)
can send the server, and that it harms nobody else.

The frontend only sends well-formed widget values; a script can send anything: a 10 MB query
string, widget ids that do not exist, a text value for a number box, 10^18, NaN, negative
numbers. The server must stay up, the other sessions must not notice (each session has its
own state), and the server's memory must not keep what the hostile session sent.

What a hostile session does to itself: a text value for a number box makes Streamlit's own
widget deserialisation raise on that session's every later run (the session shows an
exception until it is reloaded). Only that client sees it; the page code never runs with the
bad value. Recorded here as such, not as a failure.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.robustness, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import load_test  # noqa: E402

websockets = pytest.importorskip("websockets")


#: The page each open connection is on (id(websocket) -> Streamlit's page script hash).
_PAGE_HASH: dict[int, str] = {}


async def _rerun(ws: Any, query: str, widgets: tuple = ()) -> dict[str, Any]:
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    msg = BackMsg()
    msg.rerun_script.query_string = query
    # Score matrix (the page `/` opens is Will it fit?): by its URL path on the connection's
    # first run, then by the page hash the router sent back, as the frontend does
    page_hash = _PAGE_HASH.get(id(ws), "")
    msg.rerun_script.page_script_hash = page_hash
    if not page_hash:
        msg.rerun_script.page_name = load_test.PAGE_PATH
    for wid, kind, value in widgets:
        w = msg.rerun_script.widget_states.widgets.add()
        w.id = wid
        setattr(w, kind, value)
    t0 = time.perf_counter()
    await ws.send(msg.SerializeToString())
    out: dict[str, Any] = {"exceptions": [], "metric": None, "ids": {}}
    while True:
        fwd = ForwardMsg()
        fwd.ParseFromString(await asyncio.wait_for(ws.recv(), 60))
        kind = fwd.WhichOneof("type")
        if kind == "new_session" and not _PAGE_HASH.get(id(ws)):
            _PAGE_HASH[id(ws)] = fwd.new_session.page_script_hash
        elif kind == "navigation":
            _PAGE_HASH[id(ws)] = fwd.navigation.page_script_hash
        elif kind == "delta" and fwd.delta.WhichOneof("type") == "new_element":
            el = fwd.delta.new_element
            et = el.WhichOneof("type")
            if et == "exception":
                out["exceptions"].append(el.exception.message[:200])
            elif et == "metric" and out["metric"] is None:
                out["metric"] = el.metric.body.strip()
            elif et == "number_input":
                out["ids"][el.number_input.label] = el.number_input.id
        elif kind == "script_finished":
            if fwd.script_finished == 2:  # finished early for a rerun, which follows
                continue
            break
    out["seconds"] = time.perf_counter() - t0
    return out


def _connect(url: str) -> Any:
    return websockets.connect(url.replace("http://", "ws://") + "/_stcore/stream",
                              subprotocols=["streamlit"], max_size=2**27)


async def _scenario(url: str, pid: int) -> dict[str, Any]:
    found: dict[str, Any] = {}
    async with _connect(url) as bystander, _connect(url) as hostile:
        first = await _rerun(bystander, "b=1&h=32&s=4096&dtype=fp16")
        found["bystander_first"] = first["metric"]
        mine = await _rerun(hostile, "b=1&h=32&s=4096&dtype=fp16")
        heads_id = mine["ids"]["Attention heads H"]
        rss0 = load_test.rss_bytes(pid)
        attacks = [
            ("s=" + "9" * 10_000_000 + "&h=" + "%00" * 1000, ()),
            ("h=32", (("$$ID-does-not-exist-h", "int_value", 5),)),
            ("h=32", ((heads_id, "int_value", 10**18),)),
            ("h=32", ((heads_id, "int_value", -5),)),
            ("h=32", ((heads_id, "double_value", float("nan")),)),
            ("h=32", ((heads_id, "string_value", "lots"),)),
        ]
        found["attack_seconds"] = []
        for query, widgets in attacks:
            r = await _rerun(hostile, query, widgets)
            found["attack_seconds"].append(r["seconds"])
            # meanwhile the bystander keeps working, with the right numbers
            b = await _rerun(bystander, "b=1&h=64&s=4096&dtype=fp16",
                             ((first["ids"]["Attention heads H"], "int_value", 64),))
            assert not b["exceptions"], b["exceptions"]
            assert b["metric"] == load_test.expected_text(1, 64, 4096), b["metric"]
        found["rss_growth"] = load_test.rss_bytes(pid) - rss0
    async with _connect(url) as fresh:  # a new visitor after the attack
        r = await _rerun(fresh, "b=1&h=32&s=8192&dtype=fp16")
        found["fresh"] = (r["metric"], r["exceptions"])
    return found


def test_hostile_protocol_client_harms_no_other_session(tmp_path: Path) -> None:
    with load_test.app_server(tmp_path / "server.log") as (url, pid):
        found = asyncio.run(_scenario(url, pid))
        time.sleep(3)
        after = load_test.rss_bytes(pid)
    assert found["bystander_first"] == "1.07 GB"
    assert found["fresh"] == ("4.29 GB", []), found["fresh"]
    assert max(found["attack_seconds"]) < 10, found["attack_seconds"]
    assert found["rss_growth"] < 64 * 2**20, f"server grew {found['rss_growth'] / 2**20:.0f} MB"
    assert after > 0  # the server is still running
