"""attention-memory: GPU memory of attention and of the models built on it, computed and measured.

One package, one job per folder:

- ``calc``: the analytic model (pure: stdlib, pandas, transformers' config classes);
- ``kernels``: what runs attention (the bundled FlashAttention, ring attention, the transformers
  integration) and its development probes (``kernels/dev``);
- ``measure``: the measurement system (harnesses, results store, reference plans, benchmarks);
- ``pages``: the Streamlit pages that app.py routes to;
- ``cli`` and ``hub``: the ``attnmem`` command line and the Hub fetch it shares with the pages.

Importing this package imports nothing else.
"""
