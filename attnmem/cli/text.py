"""The command line's plain output: a short table per command (--json prints the dict instead)."""

from __future__ import annotations

import argparse
from typing import Any

from attnmem.cli.common import gpu_name


def _table(rows: list[tuple[str, str]]) -> list[str]:
    """Two columns, the values right-aligned so that their units line up."""
    if not rows:
        return []
    left = max(len(k) for k, _ in rows)
    right = max(len(v) for _, v in rows)
    return [f"  {k:<{left}}  {v:>{right}}" for k, v in rows]



def _tokens(n: int) -> str:
    return f"{n:,} token" + ("" if n == 1 else "s")



def _trained_note(n: int, trained: int | None) -> str:
    return (f" (past the {trained:,} tokens this model was trained for)"
            if trained and n > trained else "")



def _verdict(fits: bool, total: int, gpu: int, b: Any, needed: str = "") -> str:
    if fits:
        return f"fits: {b(gpu - total)} free ({(gpu - total) / gpu:.0%})"
    return f"does not fit: {b(total - gpu)} over" + (f"; {needed}" if needed else "")



def _text_memory(r: dict, a: argparse.Namespace, gpu: str, b: Any) -> str:
    trained = r["trained_context"]
    lines = [f"{r['model']}: inference, batch {r['batch']:,}, s = {_tokens(r['seq_len'])}"
             f"{_trained_note(r['seq_len'], trained)}, {r['impl']}",
             f"weights {a.weight_dtype}, KV cache {a.kv_dtype}, activations {a.act_dtype}; "
             f"{r['params']:,} parameters" + (f" ({r['active_params']:,} active)"
                                              if r["active_params"] != r["params"] else ""),
             ""]
    parts = r["peak_parts"] or {"weights": r["weights_bytes"], "KV cache": r["kv_cache_bytes"],
                                "attention (one layer)": r["attention_bytes"]}
    rows = [(name, b(v)) for name, v in parts.items()]
    if r["state_bytes"]:
        rows.append(("constant state (hybrid layers)", b(r["state_bytes"])))
    if "kv_cache_expanded_bytes" in r:
        rows.append(("(KV cache expanded by MLA, not counted)", b(r["kv_cache_expanded_bytes"])))
    peak = "at least " if r["total_is_lower_bound"] else ""
    rows.append((f"peak of generate(), at {r['peak_phase'] or 'prefill'}",
                 peak + b(r["total_bytes"])))
    lines += _table(rows) + [""]
    if r["not_modelled"]:
        lines.append(f"a lower bound: {r['not_modelled']}")
        lines.append("  --trace counts it all: generate() traced on the meta device"
                     + (f" (refused: {r['trace_refused']})" if r.get("trace_refused") else ""))
    if r["counted_as"]:
        lines.append(r["counted_as"])
    needed = f"needs {r['gpus_needed']:,} GPUs of this size (ideal split)"
    lines.append(f"{gpu}:\n  " + _verdict(r["fits"], r["total_bytes"], r["gpu_bytes"], b, needed))
    longest = r["longest_context"]
    if longest:
        lines.append(f"  longest context that fits: {_tokens(longest)}"
                     f"{_trained_note(longest, trained)}")
    else:
        lines.append("  longest context that fits: none, not even one token "
                     + ("(the weights alone exceed the GPU)"
                        if r["weights_bytes"] + r["state_bytes"] > r["gpu_bytes"] else ""))
    return "\n".join(line.rstrip() for line in lines)



def _text_train(r: dict, a: argparse.Namespace, gpu: str, b: Any) -> str:
    pack = (f" packed from {len(a.packed)} sequences ({', '.join(f'{n:,}' for n in a.packed)})"
            if a.packed else "")
    trained = r["trained_context"]
    past = _trained_note(max(a.packed) if a.packed else a.seq_len, trained)
    default = " (the default; --seq-len sets it)" if getattr(a, "seq_len_default", False) else ""
    lines = [f"{r['model']}: training step, batch {a.batch:,}, s = {_tokens(a.seq_len)}{default}"
             f"{pack}"
             f"{past}, {r['attention']}, precision {r['precision']}, checkpointing "
             f"{'on' if r['checkpointing'] else 'off'}, optimizer {r['optimizer']}"
             + "".join(f", {n}" for n, on in (("peft kbit prepare", r["kbit_prepare"]),
                                              ("Liger", r["liger"]),
                                              ("offloaded activations",
                                               r["offload_activations"]),
                                              ("TRL's fused LM head",
                                               r.get("loss") == "trl_fused")) if on)]
    if r["trl"]:
        lines += [f"  TRL: {n}" for n in r["trl"]["notes"]]
        if r["trl"]["ignored"]:
            lines.append(f"  TRL arguments that change no memory here: "
                         f"{', '.join(r['trl']['ignored'])}")
    if r["adapter"] == "none":
        lines.append(f"full training: {r['trainable_params']:,} trainable parameters")
    else:
        base = {"bf16": "bf16", "nf4": "4-bit NF4", "nf4_dq": "4-bit NF4, double quantization"}
        lines.append(f"{'LoRA' if r['adapter'] == 'lora' else 'QLoRA'}: rank {r['lora_rank']}, "
                     f"targets {r['lora_targets']}, {r['adapter_dtype']} adapters "
                     f"({r['trainable_params']:,} trainable parameters), frozen base "
                     f"{base[r['base_dtype']]}")
    lay = r["layout"]
    if lay and lay["gpus"] > 1:
        lines.append(f"per GPU of {lay['gpus']:,}: sharding {lay['sharding']}"
                     + (f", expert parallel over {lay['ep']:,} ranks" if lay["ep"] > 1 else ""))
    lines.append("")
    rows = [("weights", b(r["weights_bytes"])), ("gradients", b(r["gradients_bytes"])),
            ("optimizer states", b(r["optimizer_bytes"]))]
    if r["buffers_bytes"]:
        rows.append(("buffers", b(r["buffers_bytes"])))
    acts = {k: v for k, v in r["activations"].items() if v}
    rows.append(("activations kept for the backward", b(sum(acts.values()))))
    rows += [(f"  {k}", b(v)) for k, v in acts.items()]
    rows.append((f"peak of the step, at {r['peak_phase']}", b(r["peak_bytes"])))
    lines += _table(rows) + [""]
    lines.append(f"{gpu}:\n  " + _verdict(r["fits"], r["peak_bytes"], r["gpu_bytes"], b))
    longest = r["longest_context"]
    if not a.packed:
        lines.append(f"  longest context that fits on one: {_tokens(longest)}"
                     f"{_trained_note(longest, trained)}" if longest else
                     "  longest context that fits on one: none, not even one token")
    c = r["cheapest"]
    if c is not None:
        if not c["fits"]:
            lines.append("  no combination of Liger, 8-bit/paged AdamW, checkpointing and "
                         f"offloading fits (smallest peak {b(c['peak_bytes'])})")
        elif not c["levers"]:
            lines.append("  cheapest combination that fits: as it is, no lever needed")
        else:
            lines.append(f"  cheapest combination that fits: {' + '.join(c['levers'])}, "
                         f"peak {b(c['peak_bytes'])}")
            lines += _table([(f"    {s['lever']} saves", b(s["saving_bytes"]))
                             for s in c["savings"]])
    return "\n".join(lines)



def _pool_rows(r: dict, a: argparse.Namespace, b: Any, weights: str,
               activation: str) -> list[tuple[str, str]]:
    """The rows vLLM's KV pool is sized from, as both serve answers (rules, trace) print them."""
    return [(f"budget (gpu_memory_utilization {a.gpu_memory_utilization:g})",
             b(r["budget_bytes"])),
            (weights, b(r["weights_bytes"])),
            (activation, b(r["activation_bytes"])),
            ("non-torch memory", b(r["non_torch_bytes"])),
            ("CUDA graphs" + ("" if r["cuda_graphs_in_budget"] else " (outside the budget)"),
             b(r["cuda_graph_bytes"])),
            ("KV cache pool", b(r["kv_pool_bytes"])),
            (f"one KV block ({r['block_size']} tokens, all layers)", b(r["page_bytes"])),
            ("KV blocks", f"{r['num_blocks']:,}")]


def _text_serve(r: dict, a: argparse.Namespace, gpu: str, b: Any, trained: int | None) -> str:
    lines = [f"{r['model']}: serving requests of {_tokens(r['seq_len'])}"
             f"{_trained_note(r['seq_len'], trained)}", f"on {gpu}", ""]
    est = " (estimated)" if r["activation_estimated"] else ""
    rows = [*_pool_rows(r, a, b, "weights", f"activation peak{est}"),
            ("one request's KV cache", f"{b(r['bytes_per_sequence'])} = "
                                       f"{r['blocks_per_sequence']:,} blocks"),
            ("prefill attention (one layer)", b(r["prefill_attention_bytes"])),
            ("decode attention (one layer)", b(r["decode_attention_bytes"]))]
    lines += _table(rows) + [""]
    capped = (f" (capped by max_num_seqs; {r['max_concurrency']:,} by KV memory)"
              if r["concurrent_sequences"] < r["max_concurrency"] else "")
    if r["kv_pool_bytes"] == 0:
        lines.append("concurrent requests: 0: nothing is left for the KV cache (weights, "
                     "activations and overheads exceed the budget)")
    elif r["concurrent_sequences"] == 0:
        lines.append(f"concurrent requests: 0: one request of {_tokens(r['seq_len'])} needs "
                     f"{b(r['bytes_per_sequence'])}, the pool holds {b(r['kv_pool_bytes'])}")
    else:
        lines.append(f"concurrent requests: {r['concurrent_sequences']:,}{capped}")
    lines.append(f"longest context of one request: {_tokens(r['max_context'])}"
                 f"{_trained_note(r['max_context'], trained)}" if r["max_context"] else
                 "longest context of one request: none, not even one token")
    return "\n".join(lines)



def _text(command: str, result: dict, a: argparse.Namespace, model: Any) -> str:
    from attnmem.calc.units import format_bytes

    def b(n: int) -> str:  # MB/KB below 1 GB: never "0.00 GB"
        return format_bytes(n, a.unit)

    from attnmem.calc.gpus import GPU_TORCH_TOTAL, GPUS

    name = gpu_name(a.gpu)
    spec = GPUS[name]
    gpu = (f"{name} ({b(result['gpu_bytes'])} torch can use, {b(spec)} on the spec sheet)"
           if GPU_TORCH_TOTAL[name] and result["gpu_bytes"] != spec else
           f"{name} ({b(spec)}, the spec sheet's figure: no torch total is known)")
    if command == "memory":
        return _text_memory(result, a, gpu, b)
    if command == "train":
        return _text_train(result, a, gpu, b)
    return _text_serve(result, a, gpu, b, model.max_position_embeddings)



def _text_traced_train(r: dict, a: argparse.Namespace) -> str:
    from attnmem.calc.units import format_bytes

    def b(n: int) -> str:
        return format_bytes(n, a.unit)

    past = (f" (past the {r['trained_context']:,} tokens it was trained for)"
            if r["seq_len_past_trained_context"] else "")
    default = " (the default; --seq-len sets it)" if r["seq_len_is_default"] else ""
    lines = [f"{r['model']} ({r['model_class']}): training step, batch {r['batch']:,}, "
             f"s = {_tokens(r['seq_len'])}{default}{past}, {r['attention']}, precision "
             f"{r['precision']}, checkpointing {'on' if r['checkpointing'] else 'off'}, "
             "optimizer adamw (foreach)"]
    if r["trl"]:
        lines += [f"  TRL: {n}" for n in r["trl"]["notes"]]
    if r["adapter"] == "none":
        lines.append(f"full training: {r['trainable_params']:,} trainable parameters")
    else:
        lines.append(f"LoRA (peft): rank {r['lora_rank']}, targets "
                     f"{', '.join(r['lora_targets'])}, fp32 adapters "
                     f"({r['trainable_params']:,} trainable parameters), frozen base bf16")
    lines.append("")
    rows = [("weights and buffers", b(r["weights_bytes"])),
            ("AdamW state, inputs and cuBLAS workspaces",
             b(r["before_step_bytes"] - r["weights_bytes"])),
            ("before the step", b(r["before_step_bytes"])),
            ("peak of the step", b(r["peak_bytes"]))]
    lines += _table(rows) + [""]
    lines.append("largest tensors at the peak: " + "; ".join(
        f"{(where.replace('|', ' ').strip() or where)} {b(n)}" for where, _, n in r["at_peak"][:4]))
    lines.append(f"counted from the {r['counted_from']}")
    verdict = "fits" if r["fits"] else "does not fit"
    lines.append(f"{r['gpu']} ({b(r['gpu_bytes'])}): {verdict}")
    lines.append("  longest context: not searched for a traced model (each length is one "
                 f"trace of {r['trace_seconds']} s); try --seq-len values")
    return "\n".join(line.rstrip() for line in lines)



def _text_traced(r: dict, a: argparse.Namespace) -> str:
    from attnmem.calc.units import format_bytes

    def b(n: int) -> str:
        return format_bytes(n, a.unit)

    rows = [("weights and buffers", b(r["weights_bytes"])), ("KV cache", b(r["kv_cache_bytes"])),
            ("cuBLAS workspace", b(r["workspace_bytes"])),
            ("inputs and transients at the peak", b(r["activation_bytes"])),
            (f"peak of generate(), at {r['peak_phase']}", b(r["total_bytes"]))]
    past = (f" (past the {r['trained_context']:,} tokens it was trained for)"
            if r["seq_len_past_trained_context"] else "")
    lines = [f"{r['model']} ({r['model_class']}): inference, batch {r['batch']:,}, "
             f"s = {_tokens(r['seq_len'])}{past}, {r['impl']}, {r['dtype']}", ""]
    lines += _table(rows) + [""]
    lines.append("largest tensors at the peak: " + "; ".join(
        f"{where.replace('|', ' ')} {b(n)}" for where, _, n in r["at_peak"][:4]))
    if r["counted_as"]:
        lines.append(r["counted_as"])
    lines.append(f"counted from the {r['counted_from']}")
    verdict = "fits" if r["fits"] else "does not fit"
    lines.append(f"{r['gpu']} ({b(r['gpu_bytes'])}): {verdict}")
    if r["longest_context"] is None:
        lines.append("  longest context: not searched for a traced model (each length is one "
                     f"trace of {r['trace_seconds']} s); --longest searches it")
    elif r["longest_context"] == 0:
        lines.append(f"  longest context that fits: none ({r['longest_context_how']})")
    else:
        lines.append(f"  longest context that fits: {_tokens(r['longest_context'])}"
                     f"{_trained_note(r['longest_context'], r['trained_context'])} "
                     f"({r['longest_context_how']})")
    return "\n".join(line.rstrip() for line in lines)



def _text_traced_serve(r: dict, a: argparse.Namespace) -> str:
    """`attnmem serve` for a traced model: _text_serve's table, each figure's source after it."""
    from attnmem.calc.units import format_bytes

    def b(n: int) -> str:
        return format_bytes(n, a.unit)

    trained = r["trained_context"]
    act = {"bound": " (traced upper bound)", "given": " (given)",
           "not counted": " (not counted)"}[r["activation_from"]]
    lines = [f"{r['model']} ({r['model_class']}): serving requests of {_tokens(r['seq_len'])}"
             f"{_trained_note(r['seq_len'], trained)}", f"on {r['gpu']} ({b(r['gpu_bytes'])})",
             ""]
    rows = [*_pool_rows(r, a, b, "weights (traced)", f"activation peak{act}"),
            ("one request (KV blocks + state)", b(r["bytes_per_sequence"]))]
    if r["state_layers"]:
        rows.append(("  of which state (hybrid layers)", b(r["state_bytes_per_request"])))
    lines += _table(rows) + [""]
    at = ("at most " if r["capacity_is_upper_bound"] else
          "at least " if r["capacity_is_lower_bound"] else "")
    capped = (f" (capped by max_num_seqs; {at}{r['max_concurrency']:,} by KV memory)"
              if r["concurrent_sequences"] < r["max_concurrency"] else "")
    if r["kv_pool_bytes"] == 0:
        lines.append("concurrent requests: 0: nothing is left for the KV cache (weights, "
                     "activations and overheads exceed the budget)")
    elif r["concurrent_sequences"] == 0:
        lines.append(f"concurrent requests: 0: one request of {_tokens(r['seq_len'])} needs "
                     f"{b(r['bytes_per_sequence'])}, the pool holds {b(r['kv_pool_bytes'])}")
    else:
        lines.append(f"concurrent requests: {at if not capped else ''}"
                     f"{r['concurrent_sequences']:,}{capped}")
    lines.append(f"longest context of one request: {at}{_tokens(r['max_context'])}"
                 f"{_trained_note(r['max_context'], trained)}" if r["max_context"] else
                 "longest context of one request: none, not even one token")
    if r["capacity_is_upper_bound"]:
        lines.append("an upper bound: the activation peak is not in the budget "
                     "(--activation-bytes gives vLLM's logged figure)")
    lines.append("counted from:")
    lines += [f"  {part}: {src}" for part, src in r["sources"].items()]
    return "\n".join(line.rstrip() for line in lines)
