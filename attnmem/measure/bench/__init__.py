"""The speed benchmark of the bundled kernels: ``python -m attnmem.measure.bench`` (the grid, ``speed``;
``--preset training`` adds the training shapes of ``training``). Only its own command line
imports it. The one-off probes and tuning searches that set the kernels' tables live in the
top-level ``attnmem/kernels/dev/`` folder, outside the tested product."""
