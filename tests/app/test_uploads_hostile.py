"""Hostile uploads: config.json on the model page, result CSVs on the measurement page.

Issue 6: malformed JSON, wrong types, missing keys, absurd values, a 100 MB file, JSON nested
100,000 levels deep: each refused with a message, within a size limit, without reading the
whole file into memory. Result CSVs likewise, and formula-injection cells such as
`=cmd|' /C calc'!A0` must not reach an exported CSV unescaped. Nothing executes from an
upload: a crafted pickle or torch.save file is refused, and no code path uses pickle,
torch.load, eval or exec.

Two layers are tested: the loaders (attnmem.calc.config_json, attnmem.measure.store.validate_csv,
attnmem.pages.ui.export) directly, and the pages through streamlit.testing.v1.AppTest with the file
uploader replaced by a fake upload that counts the bytes read and forbids reading it whole.
"""

from __future__ import annotations

import csv
import io
import json
import pickle
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from _robust import streamlit_server_option, time_limit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnmem.calc.config_json import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    load_config_json,
    load_json_bounded,
    nesting_depth,
    read_bounded,
)
from attnmem.measure.store import (
    COLUMNS,
    MAX_UPLOAD_BYTES,
    MAX_UPLOAD_ROWS,
    ResultStore,
    csv_text,
    validate_csv,
)
from attnmem.pages.ui.export import FORMULA_START, escape_cell, safe_csv_bytes, safe_frame

pytestmark = pytest.mark.robustness

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "hf_configs"
LLAMA = json.loads((FIXTURES / "Llama-3.1-8B.json").read_text())
INJECTIONS = ["=cmd|' /C calc'!A0", "+1+1", "-2+3", "@SUM(A1:A2)", "\t=1+1", "\r=1+1",
              "=HYPERLINK(\"http://x\",\"y\")"]
#: A carriage return inside a cell: unless the cell is quoted, a spreadsheet starts a new row
#: there, and the text after it is the first cell of that row, a formula.
EMBEDDED = ["note\r=cmd|' /C calc'!A0", "a\r\n@SUM(1)", "x\n+1"]


NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")  # -0.5 is a number, not a formula


def quoted_csv(rows: list[dict[str, Any]]) -> bytes:
    """A CSV as an attacker would write it: every field quoted, so CRs survive inside cells."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), quoting=csv.QUOTE_ALL)
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue().encode()


def spreadsheet_cells(text: str) -> list[str]:
    """Cells as a spreadsheet reads a CSV: quoted fields may hold line breaks; an unquoted CR
    or LF ends the row (csv.reader refuses such a file, which a spreadsheet would not)."""
    rows = list(csv.reader(io.StringIO(text, newline=""), strict=True))
    return [c for r in rows for c in r]


def assert_no_formula(text: str) -> None:
    try:
        cells = spreadsheet_cells(text)
    except csv.Error as err:
        raise AssertionError(f"export has an unquoted line break inside a cell ({err}): a "
                             "spreadsheet starts a new row there") from err
    bad = [c for c in cells if c.startswith(FORMULA_START) and not NUMBER.fullmatch(c)]
    assert not bad, f"cells a spreadsheet runs as formulas: {bad}"


class FakeUpload:
    """What st.file_uploader returns, with a size that may lie and a counter of bytes read.

    The content is generated on demand (a 100 MB upload costs nothing until read)."""

    def __init__(self, name: str, size: int, content: bytes | None = None,
                 claimed_size: int | None = None, fill: bytes = b" ") -> None:
        self.name = name
        self._content = content
        self._size = len(content) if content is not None else size
        self.size = self._size if claimed_size is None else claimed_size
        self._fill = fill
        self.bytes_read = 0
        self.type = "application/octet-stream"

    def read(self, n: int | None = -1) -> bytes:
        left = self._size - self.bytes_read
        n = left if n is None or n < 0 else min(n, left)
        start = self.bytes_read
        self.bytes_read += n
        if self._content is not None:
            return self._content[start:start + n]
        return self._fill * n

    def getvalue(self) -> bytes:
        if self._size > 2 * MAX_UPLOAD_BYTES:
            raise AssertionError(f"getvalue() on a {self._size:,}-byte upload reads it whole")
        self.bytes_read = self._size
        return self._content if self._content is not None else self._fill * self._size

    def seek(self, pos: int, whence: int = 0) -> int:
        self.bytes_read = pos if whence == 0 else self.bytes_read
        return self.bytes_read

    def tell(self) -> int:
        return self.bytes_read


# ------------------------------------------------------------------ attnmem.calc.config_json ----

def test_config_loader_reads_a_real_config() -> None:
    for path in sorted(FIXTURES.glob("*.json")):
        assert load_config_json(path.read_bytes()) == json.loads(path.read_text())


def test_infinity_is_read_as_transformers_writes_it_and_refused_where_it_is_a_width() -> None:
    # json.dumps of a Mamba-2 config writes time_step_limit = (0.0, inf) as Infinity
    d = load_config_json('{"time_step_limit": [0.0, Infinity], "x": -Infinity}')
    assert d["time_step_limit"] == [0.0, float("inf")] and d["x"] == float("-inf")
    from attnmem.calc.models import ModelConfig

    bad = {"model_type": "llama", "hidden_size": float("inf"), "num_hidden_layers": 2,
           "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 100}
    with pytest.raises(ValueError, match="'hidden_size' must be a whole number, got inf"):
        ModelConfig.from_hf_config(load_config_json(json.dumps(bad)))


def test_100_mb_stream_is_refused_after_reading_at_most_the_limit() -> None:
    up = FakeUpload("big.json", 100_000_000, claimed_size=10)  # the size it claims is a lie
    with time_limit(5), pytest.raises(ValueError, match="larger than the limit of 1,000,000"):
        load_config_json(up)
    assert up.bytes_read <= MAX_CONFIG_BYTES + 1


def test_declared_size_over_the_limit_is_refused_without_reading() -> None:
    up = FakeUpload("big.json", 100_000_000)
    with pytest.raises(ValueError, match="100,000,000 bytes; the limit is 1,000,000"):
        load_config_json(up)
    assert up.bytes_read == 0


@pytest.mark.parametrize("depth", [MAX_CONFIG_DEPTH + 1, 1_000, 100_000])
def test_deep_nesting_is_refused_without_recursion(depth: int) -> None:
    for text in ("[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth,
                 "[" * depth):  # unclosed too
        with time_limit(5), pytest.raises(ValueError, match="nested|not valid JSON"):
            load_json_bounded(text, max_bytes=10**7)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = json.dumps({"note": "[" * 10_000 + '"\\' + "{" * 500})
    assert nesting_depth(text) == 1
    assert load_json_bounded(text, max_bytes=10**6)["note"].startswith("[[[")


@pytest.mark.parametrize(("text", "says"), [
    ("", "empty"),
    ("   \n", "empty"),
    ("{not json", "not valid JSON"),
    ('{"a": 1,}', "not valid JSON"),
    ('{"hidden_size": NaN}', "NaN is not a JSON number"),
    ('{"hidden_size": 1e999}', "too large for a float"),
    ('{"num_hidden_layers": 32, "num_hidden_layers": 2}', "given twice"),
    ('{"n": ' + "9" * 5000 + "}", "digits|limit"),
    ("[1, 2, 3]", "must be a JSON object"),
    ('"a string"', "must be a JSON object"),
    ("null", "must be a JSON object"),
    ("{}\x00", "NUL"),
])
def test_malformed_config_text_is_refused_with_a_message(text: str, says: str) -> None:
    with time_limit(5), pytest.raises(ValueError, match=says):
        load_config_json(text)


def test_non_utf8_and_binary_files_are_refused() -> None:
    for data in ("{}".encode("utf-16"), b"\xff\xfe\x00\x00", bytes(range(256))):
        with pytest.raises(ValueError, match="UTF-8|NUL|not valid JSON"):
            load_config_json(data)
    assert load_config_json(b"\xef\xbb\xbf{}") == {}  # a byte-order mark is fine


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(st.binary(max_size=300), st.text(max_size=300),
                      st.from_regex(r'[\[\]{}"\\:,0-9a-z ]{0,200}', fullmatch=True)))
def test_loader_never_raises_anything_but_value_error(data: bytes | str) -> None:
    with time_limit(2):
        try:
            load_json_bounded(data)
        except ValueError as err:
            assert str(err)


@pytest.mark.parametrize("n", [10_000, 200_000])
def test_pathological_quotes_stay_fast(n: int) -> None:
    for text in ('"' + "a" * n, '"\\' * n, "[" + '"a",' * n, '{"' + "\\\\" * n):
        with time_limit(3):
            try:
                load_json_bounded(text, max_bytes=10**7)
            except ValueError:
                pass


def test_read_bounded_on_text_and_bytes() -> None:
    assert read_bounded(b"abc", 3) == b"abc"
    with pytest.raises(ValueError, match="limit of 2"):
        read_bounded("abc", 2)
    with pytest.raises(ValueError, match="limit of 2"):
        read_bounded(io.BytesIO(b"abc"), 2)
    assert read_bounded(io.StringIO("ab"), 2) == "ab"


# ------------------------------------------------------------------ pickles and eval ----

class _Boom:
    def __reduce__(self):  # what a crafted pickle does: call something on load
        return (Path.touch, (Path("/tmp/attnmem-pwned"),))


def _crafted_pickle() -> bytes:
    return pickle.dumps(_Boom())


def _torch_save_like() -> bytes:
    """The layout of a torch.save file (a zip holding data.pkl), without importing torch."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", _crafted_pickle())
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


@pytest.mark.parametrize("make", [_crafted_pickle, _torch_save_like])
def test_crafted_pickle_or_torch_file_is_refused_everywhere(make, tmp_path: Path) -> None:
    marker = Path("/tmp/attnmem-pwned")
    marker.unlink(missing_ok=True)
    data = make()
    with pytest.raises(ValueError):
        load_config_json(data)
    v = validate_csv(data)
    assert not v.ok and v.errors
    assert not marker.exists(), "loading the upload executed code"


_DANGEROUS = re.compile(
    r"\bpickle\.loads?\(|\btorch\.load\(|\beval\(|\bexec\(|\bread_pickle\(|allow_pickle\s*=\s*True"
    r"|\bmarshal\.loads?\(|\bshelve\.open\(|\byaml\.(unsafe_)?load\(|\bdill\.|\bjoblib\.load\(")


def test_no_code_path_deserialises_or_evaluates_user_data() -> None:
    """Grep the shipped code (not tests): none of pickle/torch.load/eval/exec/... is used."""
    hits = []
    files = [ROOT / "app.py", *sorted((ROOT / "attnmem" / "pages").glob("*.py")),
             *sorted((ROOT / "attnmem" / "calc").glob("*.py")), *sorted((ROOT / "attnmem" / "kernels").glob("*.py")),
             *sorted((ROOT / "scripts").glob("*.py"))]
    for path in files:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if _DANGEROUS.search(code):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "deserialisation or eval on a code path:\n" + "\n".join(hits)


# ------------------------------------------------------------------ result CSV uploads ----

def _row(**kw: Any) -> dict[str, Any]:
    r: dict[str, Any] = {c: "" for c in COLUMNS}
    r.update(impl="naive", batch=1, heads=32, kv_heads=32, seq_len=1024, head_dim=128,
             dtype="fp16", causal=False, backward=False, status="ok", median_ms=0.15,
             tflops=114.0, peak_extra_bytes=142_606_336, gpu_name="NVIDIA H200")
    r.update(kw)
    return r


def _csv(rows: list[dict[str, Any]], columns: tuple[str, ...] = COLUMNS) -> bytes:
    buf = io.StringIO()
    pd.DataFrame(rows, columns=list(columns)).to_csv(buf, index=False)
    return buf.getvalue().encode()


@pytest.mark.parametrize(("data", "says"), [
    (b"", "empty"),
    (b"impl,batch\nnaive,1\n", "missing required column"),
    (_csv([_row(seq_len="abc")]), "seq_len must be a whole number"),
    (_csv([_row(seq_len=10**30)]), "seq_len must be from"),
    (_csv([_row(seq_len=-5)]), "seq_len must be from"),
    (_csv([_row(seq_len="nan")]), "seq_len must be a whole number"),
    (_csv([_row(peak_extra_bytes=-1)]), "peak_extra_bytes must be from"),
    (_csv([_row(median_ms="inf")]), "median_ms must be a finite number"),
    (_csv([_row(impl="rm -rf /")]), "impl must be one of"),
    (_csv([_row(dtype="float64")]), "dtype must be one of"),
    (_csv([_row(status="pwned")]), "status must be one of"),
    (_csv([_row(causal="maybe")]), "causal"),
    (_csv([_row(heads=32, kv_heads=5)]), "multiple of kv_heads"),
    (_csv([_row(message="x" * 5000)]), "longer than"),
    (b'impl,batch,heads,seq_len,head_dim,dtype,causal,backward,status,peak_extra_bytes\n"naive,1',
     "readable CSV|too few|no data|must be"),
    (b"impl,batch,heads,seq_len,head_dim,dtype,causal,backward,status,peak_extra_bytes\n"
     + b'"' + b"x" * 300_000 + b'"\n', "readable CSV|field|must be"),
    ("{}".encode("utf-16"), "UTF-8|NUL"),
])
def test_bad_result_csv_is_refused_with_a_message(data: bytes, says: str) -> None:
    with time_limit(10):
        v = validate_csv(data)
    assert not v.ok and not v.rows
    assert any(re.search(says, e) for e in v.errors), v.errors


def test_100_mb_csv_is_refused_by_size_before_parsing() -> None:
    data = b"x" * 100_000_000
    with time_limit(2):
        v = validate_csv(data)
    assert not v.ok and "the limit is" in v.errors[0]


@pytest.mark.slow
def test_too_many_rows_is_refused_quickly() -> None:
    one = _csv([_row()]).decode().splitlines()
    body = "\n".join([one[0]] + [one[1]] * (MAX_UPLOAD_ROWS + 5)).encode()
    assert len(body) < MAX_UPLOAD_BYTES
    with time_limit(60):
        v = validate_csv(body)
    assert not v.ok and any("data rows" in e for e in v.errors)


def test_injection_cells_survive_import_but_are_escaped_on_export(tmp_path: Path) -> None:
    rows = [_row(message=s, gpu_name=s, driver=s) for s in INJECTIONS]
    v = validate_csv(quoted_csv(rows))
    assert v.ok, v.errors
    store = ResultStore(tmp_path / "r.sqlite")
    run = store.import_rows(list(v.rows), label="=cmd|' /C calc'!A0", source="upload")
    exported = store.export_csv(run)
    assert_no_formula(exported)
    assert "'=cmd|' /C calc'!A0" in exported
    # our own export reads back to the same text (the apostrophe is ours, removed on import)
    back = validate_csv(exported.encode())
    assert back.ok and {r["message"] for r in back.rows} == {r["message"].strip() for r in rows}


def test_csv_text_escapes_every_formula_start() -> None:
    assert_no_formula(csv_text([{"message": s} for s in INJECTIONS], columns=("message",)))


def test_csv_text_quotes_line_breaks_inside_cells(tmp_path: Path) -> None:
    assert_no_formula(csv_text([{"message": "\r=1+1"}], columns=("message",)))
    v = validate_csv(quoted_csv([_row(message=s) for s in EMBEDDED]))
    assert v.ok, v.errors
    store = ResultStore(tmp_path / "r.sqlite")
    run = store.import_rows(list(v.rows), label="x", source="upload")
    assert_no_formula(store.export_csv(run))


# ------------------------------------------------------------------ attnmem.pages.ui.export ----

@pytest.mark.parametrize("dtype", [object, "string", "str", "category"])
def test_safe_frame_escapes_text_of_any_dtype(dtype: Any) -> None:
    cells = INJECTIONS + EMBEDDED
    df = pd.DataFrame({"model": pd.Series(cells, dtype=dtype),
                       "bytes": range(len(cells)), "err": [-0.5] * len(cells)})
    text = safe_csv_bytes(df).decode()
    assert_no_formula(text)
    assert "\n-0.5" not in text and ",-0.5" in text  # numbers stay numbers (unquoted)
    assert safe_frame(df)["bytes"].tolist() == list(range(len(cells)))


def test_escape_cell_leaves_harmless_values() -> None:
    assert escape_cell("naive") == "naive"
    assert escape_cell(-5) == -5
    assert escape_cell(None) is None
    assert escape_cell("=1") == "'=1"


def test_page_csv_downloads_escape_text_columns() -> None:
    from attnmem.pages.ui.charts import csv_bytes

    df = pd.DataFrame({"model": INJECTIONS + EMBEDDED, "bytes": range(len(INJECTIONS) + 3)})
    assert_no_formula(csv_bytes(df).decode())


# ------------------------------------------------------------------ the pages ----

MODEL_PAGE = str(ROOT / "attnmem" / "pages" / "model_memory.py")
MEASURE_PAGE = str(ROOT / "attnmem" / "pages" / "measure.py")


@pytest.fixture
def fake_uploader(monkeypatch: pytest.MonkeyPatch):
    """Replace st.file_uploader (every container's) by one returning uploads[key]."""
    import streamlit
    from streamlit.delta_generator import DeltaGenerator

    uploads: dict[str, Any] = {}
    calls: dict[str, dict[str, Any]] = {}
    real = DeltaGenerator.file_uploader

    def fake(self, label, *args, **kwargs):
        key = kwargs.get("key")
        calls[key] = kwargs
        if key in uploads:
            real(self, label, *args, **kwargs)  # keep the widget on the page
            return uploads[key]
        return real(self, label, *args, **kwargs)

    monkeypatch.setattr(DeltaGenerator, "file_uploader", fake)
    # st.file_uploader is the main container's method, bound when streamlit was imported
    monkeypatch.setattr(streamlit, "file_uploader",
                        lambda *a, **k: fake(streamlit._main, *a, **k))
    return uploads, calls


def _model_page(uploads: dict[str, Any], up: FakeUpload):
    from streamlit.testing.v1 import AppTest

    uploads["cfg_file"] = up
    at = AppTest.from_file(MODEL_PAGE, default_timeout=120)
    at.query_params["model"] = "Custom config.json"
    with time_limit(120):
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


HOSTILE_CONFIGS = {
    "100 MB (size told)": FakeUpload("big.json", 100_000_000),
    "100 MB (size hidden)": FakeUpload("big.json", 100_000_000, claimed_size=100),
    "malformed": FakeUpload("c.json", 0, b"{not json"),
    "wrong types": FakeUpload("c.json", 0, json.dumps(
        {**LLAMA, "num_hidden_layers": "32"}).encode()),
    "missing keys": FakeUpload("c.json", 0, json.dumps(  # no model_type: no class to fill in
        {k: v for k, v in LLAMA.items() if k not in ("hidden_size", "model_type")}).encode()),
    "absurd values": FakeUpload("c.json", 0, json.dumps(
        {**LLAMA, "num_hidden_layers": 10**30}).encode()),
    "negative": FakeUpload("c.json", 0, json.dumps({**LLAMA, "vocab_size": -1}).encode()),
    "NaN": FakeUpload("c.json", 0, json.dumps({**LLAMA, "hidden_size": float("nan")}).encode()),
    "deep 100k": FakeUpload("c.json", 0, b"[" * 100_000 + b"]" * 100_000),
    "not an object": FakeUpload("c.json", 0, b"[1, 2, 3]"),
    "not UTF-8": FakeUpload("c.json", 0, "{}".encode("utf-16")),
    "pickle": FakeUpload("c.json", 0, _crafted_pickle()),
    "torch.save": FakeUpload("c.json", 0, _torch_save_like()),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(HOSTILE_CONFIGS))
def test_model_page_refuses_hostile_config_upload(case: str, fake_uploader) -> None:
    uploads, _ = fake_uploader
    up = HOSTILE_CONFIGS[case]
    up.bytes_read = 0
    at = _model_page(uploads, up)
    errors = [e.value for e in at.error]
    assert any("Could not use this config" in e for e in errors), errors
    assert up.bytes_read <= MAX_CONFIG_BYTES + 1, f"read {up.bytes_read:,} bytes"
    assert not Path("/tmp/attnmem-pwned").exists()


@pytest.mark.slow
def test_model_page_uses_a_valid_uploaded_config(fake_uploader) -> None:
    uploads, _ = fake_uploader
    at = _model_page(uploads, FakeUpload("my-model.json", 0,
                                         (FIXTURES / "Mistral-7B-v0.1.json").read_bytes()))
    assert not at.error
    assert any("my-model" in c.value.replace("\\", "") for c in at.caption)


@pytest.mark.slow
def test_model_page_refuses_duplicate_keys(fake_uploader) -> None:
    uploads, _ = fake_uploader
    text = json.dumps(LLAMA)[:-1] + ', "num_hidden_layers": 2}'
    at = _model_page(uploads, FakeUpload("dup.json", 0, text.encode()))
    assert any("given twice" in e.value for e in at.error), [e.value for e in at.error]


@pytest.mark.slow
def test_measure_page_refuses_hostile_csv_upload(fake_uploader, tmp_path, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("ATTNMEM_DB", str(tmp_path / "r.sqlite"))
    uploads, _ = fake_uploader
    for data in (b"{not a csv", _crafted_pickle(), _csv([_row(seq_len=-5)]),
                 b"impl,batch\nnaive,1\n"):
        uploads["upload"] = FakeUpload("r.csv", 0, data)
        at = AppTest.from_file(MEASURE_PAGE, default_timeout=180)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert any("was not imported" in e.value for e in at.error), [e.value for e in at.error]
    assert ResultStore(tmp_path / "r.sqlite").runs() == []  # nothing changed


@pytest.mark.slow
def test_measure_page_bounds_the_csv_upload(fake_uploader, tmp_path, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("ATTNMEM_DB", str(tmp_path / "r.sqlite"))
    uploads, calls = fake_uploader
    uploads["upload"] = FakeUpload("big.csv", 100_000_000)
    at = AppTest.from_file(MEASURE_PAGE, default_timeout=180)
    at.run()
    limit = calls["upload"].get("max_upload_size")
    assert limit is not None and limit * 2**20 <= 2 * MAX_UPLOAD_BYTES, calls["upload"]
    assert not at.exception, [e.value for e in at.exception]
    assert uploads["upload"].bytes_read <= MAX_UPLOAD_BYTES + 1


def test_server_caps_every_upload() -> None:
    """Streamlit enforces only the global server.maxUploadSize on the server (a widget's
    max_upload_size is checked by the browser): it must be small, not the 200 MB default."""
    limit_mb = streamlit_server_option(ROOT, "maxUploadSize", 200)
    assert isinstance(limit_mb, int)
    assert limit_mb <= 32, f"server.maxUploadSize is {limit_mb} MB"
    assert limit_mb * 2**20 >= MAX_UPLOAD_BYTES  # the CSV limit still fits


def _put_upload(url: str, session_id: str, xsrf_cookie: str, size: int) -> int | str:
    """PUT a multipart upload of `size` bytes to Streamlit's upload endpoint, as a script (not
    a browser) would: the XSRF cookie and header it needs come from /_stcore/health."""
    import http.client
    import uuid
    from urllib.parse import urlsplit

    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            "filename=\"big.csv\"\r\nContent-Type: text/csv\r\n\r\n").encode()
    body += b"x" * size + f"\r\n--{boundary}--\r\n".encode()
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("PUT", f"/_stcore/upload_file/{session_id}/{uuid.uuid4().hex}", body=body,
                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}",
                              "Cookie": xsrf_cookie,
                              "X-Xsrftoken": xsrf_cookie.split("=", 1)[1]})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (BrokenPipeError, ConnectionResetError):
        return "connection closed by the server"
    finally:
        conn.close()


async def _scripted_upload(url: str, pid: int, size: int) -> tuple[int | str, int]:
    import asyncio
    import urllib.request

    import websockets
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    sys.path.insert(0, str(ROOT / "scripts"))
    import load_test

    with urllib.request.urlopen(f"{url}/_stcore/health", timeout=10) as resp:
        cookies = [v.split(";")[0] for k, v in resp.headers.items() if k.lower() == "set-cookie"]
    cookie = next(c for c in cookies if c.startswith("_streamlit_xsrf="))
    async with websockets.connect(url.replace("http://", "ws://") + "/_stcore/stream",
                                  subprotocols=["streamlit"], max_size=2**26) as ws:
        msg = BackMsg()
        msg.rerun_script.query_string = ""
        await ws.send(msg.SerializeToString())
        session_id = ""
        while not session_id:
            fwd = ForwardMsg()
            fwd.ParseFromString(await asyncio.wait_for(ws.recv(), 60))
            if fwd.WhichOneof("type") == "new_session":
                session_id = fwd.new_session.initialize.session_id
        # Let the first script run finish (imports, charts) so that only the upload is weighed.
        while fwd.WhichOneof("type") != "script_finished":
            fwd = ForwardMsg()
            fwd.ParseFromString(await asyncio.wait_for(ws.recv(), 60))
        before = load_test.rss_bytes(pid)
        status = await asyncio.to_thread(_put_upload, url, session_id, cookie, size)
        return status, load_test.rss_bytes(pid) - before


@pytest.mark.slow
def test_server_refuses_a_scripted_30_mb_upload(tmp_path: Path) -> None:
    import asyncio

    sys.path.insert(0, str(ROOT / "scripts"))
    import load_test

    with load_test.app_server(tmp_path / "server.log") as (url, pid):
        status, grew = asyncio.run(_scripted_upload(url, pid, 30 * 2**20))
    assert status in (413, "connection closed by the server"), status
    assert grew < 40 * 2**20, f"server RSS grew by {grew / 2**20:.0f} MB (status {status})"
