"""Benchmark and tuning tools for the bundled kernels. Only their own command lines import
them: ``python -m kernels.bench`` (the speed grid, ``speed``), ``python -m kernels.bench.tune_fwd``
and ``python -m kernels.bench.tune_bwd`` (tile searches), and the probes beside them (host-time
profiles, register and PTX checks, threshold sweeps), each ``python -m kernels.bench.<name>``."""
