"""The measurement system: the registry of named implementations (``registry``), the shape of a
result (``schema``: statuses, columns, dtypes), one measured point (``harness``), the child
process that runs points away from the app (``child``), the trace fingerprint (``trace``), the
results store (``store``), the speed benchmark's result rows (``speed_results``), the exposure
policy (``exposure``) and the command line (``python -m attnmem.measure``, ``cli``); whole
models: training steps (``train/``: config, procedure, worker, store, plan, command line),
sharded steps (``train_dist``), generate() (``infer/``: the same files as ``train/``, and
``infer_models``), what the three share (``model_common``, ``run_common``) and live tensor
bytes on any device (``live_bytes``). Pages read results through this package; importing it
imports neither torch nor triton."""
