"""kernels.direct.DirectLauncher on the CPU, with a stand-in for a JIT function: what it
keeps, when it launches directly, and when it leaves every launch to the JIT."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

pytest.importorskip("triton")
from kernels import direct  # noqa: E402


class FakeKernel:
    function, packed_metadata = "fn", "meta"

    def __init__(self, log):
        self.log = log

    def run(self, *a):
        self.log.append(("direct", a))


class FakeJIT:
    """fn[grid](*args, **kwargs) as Triton's JIT: records the call, returns a compiled kernel."""

    def __init__(self):
        self.log = []
        self.params = [SimpleNamespace(name=n, default=d) for n, d in (
            ("X", inspect.Parameter.empty), ("n", inspect.Parameter.empty),
            ("BLOCK", inspect.Parameter.empty), ("EXTRA", 5))]

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(("jit", grid, args, kwargs))
            return FakeKernel(self.log)
        return launch


def _launcher(hooks=None, max_entries=4096):
    fn = FakeJIT()
    lau = direct.DirectLauncher(fn, max_entries=max_entries)
    lau._runtime = SimpleNamespace(launch_enter_hook=hooks, launch_exit_hook=None)
    lau._device, lau._stream = (lambda: 0), (lambda dev: 99)
    return fn, lau


def test_first_call_jit_then_direct_with_the_bound_tail():
    fn, lau = _launcher()
    for _ in range(3):
        lau((4, 2), ("k",), ("x", 10), {"BLOCK": 64, "num_warps": 4})
    assert [e[0] for e in fn.log] == ["jit", "direct", "direct"]
    # grid padded to 3-d, the raw stream, no hooks, then args and the constexprs in order
    # (BLOCK given, EXTRA its default); launch options are not parameters
    assert fn.log[1][1] == (4, 2, 1, 99, "fn", "meta", None, None, None, "x", 10, 64, 5)
    assert lau.direct_calls == 2


def test_other_keys_hooks_and_no_key_take_the_jit_path(monkeypatch):
    fn, lau = _launcher()
    lau((1,), ("a",), ("x", 1), {"BLOCK": 16})
    lau((1,), ("b",), ("x", 1), {"BLOCK": 16})  # another specialisation: compiled apart
    lau((1,), None, ("x", 1), {"BLOCK": 16})  # no key: never cached
    assert [e[0] for e in fn.log] == ["jit", "jit", "jit"] and len(lau.cache) == 2
    fn, lau = _launcher(hooks=lambda *a: None)  # a profiler's hook sees every launch
    lau((1,), ("a",), ("x", 1), {"BLOCK": 16})
    lau((1,), ("a",), ("x", 1), {"BLOCK": 16})
    assert [e[0] for e in fn.log] == ["jit", "jit"] and not lau.cache
    fn, lau = _launcher()
    monkeypatch.setattr(direct, "DIRECT_LAUNCH", False)  # FLASH_ATTN_DIRECT_LAUNCH=0
    lau((1,), ("a",), ("x", 1), {"BLOCK": 16})
    lau((1,), ("a",), ("x", 1), {"BLOCK": 16})
    assert [e[0] for e in fn.log] == ["jit", "jit"]


def test_a_missing_constexpr_is_not_cached_and_the_table_is_bounded():
    fn, lau = _launcher(max_entries=2)
    lau((1,), ("a",), ("x", 1), {})  # BLOCK neither given nor defaulted: keep nothing
    assert not lau.cache
    for key in "abc":
        lau((1,), (key,), ("x", 1), {"BLOCK": 16})
    assert len(lau.cache) == 1  # emptied when full, then the newest kept
