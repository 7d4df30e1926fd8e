"""Inference (``model.generate()``) of real transformers models, measured (``python -m
attnmem.measure --infer``); the training side's files (``attnmem.measure.train``), for
generate():

- ``config``: one configuration (``InferConfig``), one row (``InferResult``, the CSV's columns,
  documented there), the attentions and caches, the argument check and the shape columns;
- ``predict``: attnmem.calc.inference_step's prediction for a configuration;
- ``procedure``: ``measure_infer``, one configuration measured in this process (the steps
  attnmem.calc.inference_step predicts), and the model the worker keeps between configurations;
- ``worker``: the child process that measures and ``run_infer``, the parent that feeds it
  under the GPU lock (timeouts, crashes, OOM series, time budget);
- ``store``: typed rows from a CSV (``read_rows``, what pages use; no torch), the CSV writer,
  the SQLite ``InferStore``, and ``repredict``;
- ``plan``: ``expand`` (the cross product) and the bundled sweeps (``h200``, ``h200-sdpa``);
- ``cli``: the command line.

The models are ``attnmem.measure.infer_models`` (as training's are ``train_models``). What the
training, sharded-training (``attnmem.measure.train_dist``) and inference harnesses share
(attention names, environment columns, error classes, the worker protocol, list parsing) is
``attnmem.measure.model_common``, and their run loop, worker loop, SQLite store and CSV
reader are ``attnmem.measure.run_common``. Importing any of these imports neither torch nor
transformers.
"""
