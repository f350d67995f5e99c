"""The GPU check's report: each part's section in ``gpu.md`` beside ``gpu.json``, both written atomically after every part."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from qgmem_train.fileio import write_report_atomic

PARTS = ("tests", "bf16", "prefix_cache", "nf4", "lora_nf4", "predict")
TITLES = {
    "tests": "CUDA-marked tests (`pytest -m gpu`)",
    "bf16": "bf16 training steps: gradient checkpointing off vs on (Qwen3-8B-shaped backbone, a few layers)",
    "prefix_cache": "Frozen-prefix cache: decoder step off vs on, explicit mask vs bottom-right bias (Qwen3-8B shape, bf16), fp32 logits",
    "nf4": "NF4 (4-bit) backbone: load and train (Qwen3-8B-shaped, a few layers)",
    "lora_nf4": "LoRA (r=8) on the NF4 backbone (Qwen3-8B-shaped, a few layers)",
    "predict": "predict (constrained generation)",
}


def fmt(value: Any, digits: int = 3) -> str:
    """A number for a table cell (``n/a`` when missing)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def status_line(record: dict[str, Any] | None) -> str:
    """The first line of a part's section: ok, skipped, failed or timed out, and why."""
    if record is None:
        return "**not run**"
    status = record["status"]
    seconds = f" in {record['seconds']} s" if record.get("seconds") is not None else ""
    if status == "ok":
        return f"**ok**{seconds}"
    if status == "skipped":
        return f"**skipped**: {record.get('reason')}"
    if status == "running":
        return "**interrupted**: the part never recorded a result"
    return f"**{status}**{seconds}: {record.get('error', '')}"


def comparison_line(comparison: dict[str, Any], label: str) -> str:
    """A :func:`gpu_timing.compare` result in words: the mean ratio with its 90% interval and the rounds' range, claimed
    as a difference only on that verdict (no faster or slower is claimed otherwise)."""
    spread = f"rounds ×{comparison['low']:.2f} to ×{comparison['high']:.2f}"
    low, high = comparison["interval"]
    if comparison["verdict"] == "too few rounds":
        return f"{label}, device time a step: no verdict from {len(comparison['per_round'])} rounds (at least {comparison['min_rounds']}; ×{comparison['ratio']:.2f}, {spread})"
    if comparison["verdict"] == "no difference":
        return f"{label}, device time a step: no difference of {comparison['min_effect']:.0%} or more shown (×{comparison['ratio']:.2f}, 90% interval ×{low:.2f} to ×{high:.2f}; {spread})"
    return f"{label}, device time a step: ×{comparison['ratio']:.2f} (90% interval ×{low:.2f} to ×{high:.2f}; {spread})"


VARIANT_HEADER = [
    "| variant | device ms a step (median) | per-round medians | host ms (median) | peak CUDA GiB | above resident GiB | "
    "decoder-layer passes a step | tokens a sequence | loss first → last | load s |",
    "|---|---|---|---|---|---|---|---|---|---|",
]


def variant_row(label: str, r: dict[str, Any]) -> str:
    """One table row of a variant's alternated training steps."""
    rounds = ", ".join(fmt(x, 1) for x in r["device_ms_round_medians"])
    return (
        f"| {label} | {fmt(r['device_ms_median'], 1)} | {rounds} | {fmt(r['host_ms_median'], 1)} | {fmt(r.get('peak_gib'), 2)} | "
        f"{fmt(r.get('above_resident_gib'), 2)} | {fmt(r.get('decoder_layer_calls_per_step'), 1)} | {fmt(r.get('sequence_tokens'), 0)} | "
        f"{fmt(r.get('loss_first'))} → {fmt(r.get('loss_last'))} | {fmt(r.get('load_s'), 1)} |"
    )


def backbone_line(backbone: dict[str, Any]) -> str:
    """The timed parts' backbone in words: its shape and the sizes that set a step's work."""
    return (
        f"Backbone: {backbone['shape']} shape, {backbone['weights']} weights: {backbone['num_hidden_layers']} decoder layers of hidden size "
        f"{backbone['hidden_size']}, {backbone['num_attention_heads']} query and {backbone['num_key_value_heads']} key-value heads of "
        f"{backbone['head_dim']}, intermediate size {backbone['intermediate_size']}; vocabulary {backbone['vocab_size']:,} (the check's tokenizer)."
    )


def module_steps_markdown(name: str, record: dict[str, Any]) -> list[str]:
    """A timed part's table (one row a variant) and its comparison in words."""
    prefix = "checkpointing " if name == "bf16" else ""
    comparison = record["comparison"]
    lines = [backbone_line(record["backbone"]), ""] if record.get("backbone") else []
    lines += [
        f"{len(record['variants'])} variants alternated for {record['rounds']} rounds in one process, each round {record['warmup_steps']} "
        f"untimed then {record['steps']} timed training steps a variant; device time by CUDA events (the wall clock on a CPU), host preparation apart.",
        "",
        *VARIANT_HEADER,
        *(variant_row(f"{prefix}{label}", r) for label, r in record["variants"].items()),
        "",
        comparison_line(comparison, f"{prefix}{comparison['other']} / {comparison['base']}") + ".",
    ]
    extra = record["variants"][comparison["other"]]
    if "linear_4bit_layers" in extra:
        words = f"{comparison['other']}: {extra['linear_4bit_layers']} Linear4bit layers"
        if "lora_b_tensors" in extra:
            words += (
                f"; {extra['trainable_parameters']:,} trainable parameters, {extra['lora_parameters']:,} of them LoRA; "
                f"{extra['lora_b_trained']} of {extra['lora_b_tensors']} LoRA B tensors trained"
            )
        lines.append(words + ".")
    return lines


def prefix_cache_markdown(record: dict[str, Any]) -> list[str]:
    """The prefix-cache part's tables: decoder step device/host time per batch and variant, then the attention call alone."""
    differences = ", ".join(f"{name}: {value:.1e}" for name, value in record["first_step_logits_relative_difference"].items())
    lines = [
        f"{record['shape']}, {record['steps'][0]['tokens']} tokens a sequence of which {record['prefix_tokens']} are the prompt prefix; "
        f"the variants alternated for {record['rounds']} rounds in one process. fp32 first-step logits against those without the cache "
        f"differ by ({differences}) relative to the largest (allowed 1e-4).",
        "",
        "| batch | variant | attention mask | device ms a step (median) | per-round medians | host ms (median) |",
        "|---|---|---|---|---|---|",
    ]
    ratios = []
    for run in record["steps"]:
        for variant, r in run["variants"].items():
            rounds = ", ".join(fmt(x, 1) for x in r["device_ms_round_medians"])
            lines.append(
                f"| batch {run['batch']} | {variant} | {r['attention_mask']} | {fmt(r['device_ms_median'], 1)} | {rounds} | {fmt(r['host_ms_median'], 2)} |"
            )
        ratios += [comparison_line(c, f"batch {run['batch']}, {c['other']} / {c['base']}") + "." for c in run["comparisons"]]
    lines += ["", *ratios, "", "| attention call (forward + backward) | " + " | ".join(record["attention"]) + " |"]
    lines.append("|---|" + "---|" * len(record["attention"]))
    cases = next(iter(record["attention"].values()))
    for case in cases:
        lines.append(f"| {case} | " + " | ".join(f"{fmt(b[case]['device_ms_median'], 3)} ms" for b in record["attention"].values()) + " |")
    return lines


def markdown(result: dict[str, Any]) -> str:
    """Every part's section (its status line first, then what it measured), after the machine and settings."""
    env, parts = result.get("environment", {}), result.get("parts", {})
    settings = env.get("settings", {})
    gpu = f"{env['gpu']} ({env['gpu_memory_gib']} GiB)" if env.get("gpu") else "no CUDA device"
    versions = ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items())
    machine = env.get("machine", {})
    lines = [
        f"# GPU check{' (smoke run)' if result.get('smoke') else ''}: {gpu}",
        "",
        f"torch {machine.get('torch')} (CUDA {env.get('torch_cuda')}), {versions}; {machine.get('cpu')}, {machine.get('cores')} cores. "
        f"Commit {env.get('commit')}. Written by `scripts/gpu_check.sh` / `bench/gpu_check.py`.",
        "",
        f"Settings: LLM {settings.get('llm')}, batch {settings.get('batch_size')}, contexts cut to {settings.get('seq_tokens')} tokens, "
        f"timed parts alternate their variants for {settings.get('rounds')} rounds of {settings.get('warmup_steps')} untimed and "
        f"{settings.get('steps')} timed steps each, configs/demo-cpu.yaml's model settings otherwise.",
    ]
    models = next((r["models"] for r in parts.values() if r.get("models")), {})
    for kind, note in models.items():
        if note != settings.get(kind):
            lines += ["", f"**{kind}**: {note}."]
    for name in PARTS:
        record = parts.get(name)
        lines += ["", f"## {TITLES[name]}", "", status_line(record)]
        if not record or record["status"] in ("skipped", "running"):
            continue
        if name == "tests" and record.get("summary"):
            lines += ["", f"`{record.get('command')}`: {record['summary']}"] + [f"- {f}" for f in record.get("failures", [])]
        elif name == "prefix_cache" and record.get("steps"):
            lines += ["", *prefix_cache_markdown(record)]
        elif name in ("bf16", "nf4", "lora_nf4") and record.get("comparison"):
            lines += ["", *module_steps_markdown(name, record)]
        elif name == "predict" and "examples" in record:
            lines += [
                "",
                "| examples | schema-valid | exact match | F1 | predict s | s an example | max new tokens |",
                "|---|---|---|---|---|---|---|",
                f"| {record['examples']} | {fmt(record['schema_valid'], 2)} | {fmt(record['exact_match'], 2)} | {fmt(record['f1'], 2)} | "
                f"{fmt(record['predict_s'], 2)} | {fmt(record['s_per_example'], 2)} | {record.get('max_new_tokens')} |",
                "",
                f"After {record.get('steps')} training steps. First generation: `{(record.get('sample') or '').replace('`', chr(39))[:200]}`",
            ]
    return "\n".join(lines) + "\n"


def load_results(path: Path, run_id: str | None) -> dict[str, Any]:
    """The results file of the same run (``--run-id``), else a fresh one."""
    if run_id and path.exists():
        try:
            existing = json.loads(path.read_text())
        except (OSError, ValueError):
            existing = {}
        if existing.get("run_id") == run_id:
            return existing
    return {"run_id": run_id, "parts": {}}


def write(result: dict[str, Any], path: Path) -> None:
    """Write the results so far as JSON and Markdown, atomically."""
    write_report_atomic(path, result, markdown(result))
