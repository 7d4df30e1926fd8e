"""Training steps of real transformers models, measured (``python -m attnmem.measure --train``);
the attention side's files, for whole models:

- ``config``: one configuration (``TrainConfig``), one row (``TrainResult``, the CSV's columns,
  documented there), the precisions, the argument check and the shape columns;
- ``predict``: attnmem.calc.training_step's prediction for a configuration;
- ``procedure``: ``measure_train_step``, one configuration measured in this process;
- ``finetune``: LoRA through peft and QLoRA's 4-bit base through bitsandbytes, set up as
  attnmem.calc.training_step's LoRA replays assume (issue 34);
- ``recipes``: the fine-tuning recipe a row runs (issue 43): its optimizer, peft's prepare
  step, Liger's kernels (patched and undone), activation offloading;
- ``worker``: the child process that measures and ``run_train``, the parent that feeds it
  under the GPU lock (timeouts, crashes, OOM series, time budget);
- ``store``: typed rows from a CSV (``read_rows``, what pages use; no torch), the SQLite
  ``TrainStore``, and ``repredict``;
- ``plan``: ``expand`` (the cross product, ``lora_variants``, ``lever_variants``) and the
  bundled sweeps (``h200``, ``h200-lora``, ``h200-moe``, ``h200-packed``, ``h200-unruled``,
  ``h200-recipes``);
- ``cli``: the command line.

Fine-tuning (LoRA, QLoRA, MoE; issue 34) extends the same files: its fields in ``TrainConfig``
and its columns in ``TrainResult`` (config; the readers type a new column from its field's
type), its model build in ``procedure``, its prediction in ``predict``, its options in
``cli``; the worker carries configurations and rows whatever their fields (a SQLite file
made before a new column needs that column added).

Packed (padding-free) rows (issue 31): ``TrainConfig.packed`` (the lengths joined by '+'),
the ``packed_lengths`` column, ``procedure.packed_inputs`` (position_ids restarting per
sequence and labels, as transformers' DataCollatorWithFlattening makes them), calc's
``packed_lengths`` in ``predict``, ``--packed`` and ``--plan h200-packed`` in ``cli``.

What the training, sharded-training (``attnmem.measure.train_dist``) and inference harnesses
share (attention names, environment columns, error classes, the worker protocol, list
parsing) is ``attnmem.measure.model_common``. Importing any of these imports neither torch nor
transformers.
"""
