"""Whether the traced profile run (attnmem.trace.serving.trace_profile_run) is above calc's
count of vLLM's own modules (attnmem.calc.serving.activation_peak_estimate) on every bundled
preset calc has rules for: the check behind calling the trace's activation term an upper bound
for models outside the rules. Prints one line per preset and batched-token count; the ratio
includes the trace's 32 MiB cuBLAS workspace, which calc's count leaves out.

    .venv/bin/python scripts/serving_bound.py [TOKENS ...]   (default: 512 8192)
"""

from __future__ import annotations

import copy
import sys
import time

from attnmem.calc import MODELS
from attnmem.calc.presets import PRESET_HF_CONFIGS
from attnmem.calc.serving import activation_peak_estimate
from attnmem.trace.serving import trace_profile_run

MIB = 2**20


def main(tokens: list[int]) -> None:
    for name, (_source, d) in PRESET_HF_CONFIGS.items():
        model = MODELS.get(name)
        if model is None:
            continue
        for t in tokens:
            t0 = time.perf_counter()
            try:
                est = activation_peak_estimate(model, t, "bf16", 256)
                tr = trace_profile_run(copy.deepcopy(d), t, 256)
            except ValueError as err:
                print(f"{name:30s} T={t:6d} not traced: {str(err)[:120]}", flush=True)
                continue
            print(f"{name:30s} T={t:6d} calc(vLLM) {est / MIB:9.1f} MiB  trace "
                  f"{tr.activation_bytes / MIB:9.1f} MiB  ratio "
                  f"{tr.activation_bytes / est:5.2f}  {tr.attention:5s} "
                  f"{time.perf_counter() - t0:4.1f} s", flush=True)


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [512, 8192])
