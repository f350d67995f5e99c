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
    "bf16": "bf16 fit: gradient checkpointing off vs on",
    "prefix_cache": "Frozen-prefix cache: decoder step off vs on (Qwen3-8B shape, bf16), fp32 logits, attention kernels",
    "nf4": "NF4 (4-bit) backbone: load and train",
    "lora_nf4": "LoRA (r=8) on the NF4 backbone",
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


def fit_row(label: str, r: dict[str, Any]) -> str:
    """One table row of a fit's measurements."""
    if "error" in r and "step_s_median" not in r:
        return f"| {label} | failed: {r['error']} |  |  |  |  |  |"
    loss = f"{fmt(r.get('loss_first'))} → {fmt(r.get('loss_last'))}"
    return (
        f"| {label} | {fmt(r.get('step_s_median'))} | {fmt(r.get('peak_gib'), 2)} | {fmt(r.get('above_resident_gib'), 2)} | "
        f"{fmt(r.get('decoder_layer_calls_per_step'), 1)} | {fmt(r.get('sequence_tokens'), 0)} | {loss} |"
    )


FIT_HEADER = [
    "| run | step s (median) | peak CUDA GiB | above resident GiB | decoder-layer calls a step | tokens a sequence | loss first → last |",
    "|---|---|---|---|---|---|---|",
]


def prefix_cache_markdown(record: dict[str, Any]) -> list[str]:
    """The prefix-cache part's tables: decoder step device/host time per batch and variant, then the attention call alone."""
    lines = [
        f"{record['shape']}, {record['steps'][0]['tokens']} tokens a sequence of which {record['prefix_tokens']} are the prompt prefix; "
        f"cache off and on alternated for {record['rounds']} rounds in one process. fp32 first-step logits with vs without the cache "
        f"differ by {record['first_step_logits_relative_difference']:.1e} relative (allowed 1e-4).",
        "",
        "| batch | variant | device ms a step (median) | per-round medians | host ms (median) |",
        "|---|---|---|---|---|",
    ]
    ratios = []
    for run in record["steps"]:
        for variant in ("off", "on"):
            r = run[variant]
            rounds = ", ".join(fmt(x, 1) for x in r["device_ms_round_medians"])
            lines.append(f"| batch {run['batch']} | cache {variant} | {fmt(r['device_ms_median'], 1)} | {rounds} | {fmt(r['host_ms_median'], 2)} |")
        per_round = ", ".join(f"×{x:.2f}" for x in run["device_on_over_off_per_round"])
        ratios.append(f"batch {run['batch']}: ×{run['device_on_over_off']:.2f} (rounds {per_round})")
    lines += ["", f"Cache on / off, decoder step device time: {'; '.join(ratios)}.", "", "| attention call (forward + backward) | " + " | ".join(record["attention"]) + " |"]
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
        f"{settings.get('steps')} steps a fit (step times are medians after {settings.get('warmup_steps')} warm-up steps), "
        "configs/demo-cpu.yaml's model settings otherwise.",
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
        elif name == "bf16" and record.get("variants"):
            label = "checkpointing"
            lines += ["", *FIT_HEADER]
            lines += [fit_row(f"{label} {v}", r) for v, r in record["variants"].items()]
            ratios = []
            if record.get("step_time_on_over_off"):
                ratios.append(f"step time ×{record['step_time_on_over_off']:.2f}")
            if record.get("memory_above_resident_on_over_off") is not None:
                ratios.append(f"memory above resident ×{record['memory_above_resident_on_over_off']:.2f}")
            if ratios:
                lines += ["", f"{label.capitalize()} on / off: {', '.join(ratios)} (precision {record.get('precision')})."]
        elif name in ("nf4", "lora_nf4") and "step_s_median" in record:
            lines += ["", *FIT_HEADER, fit_row(name, record), ""]
            extra = f"Load (setup to first step) {fmt(record.get('load_s'), 1)} s; {record.get('linear_4bit_layers')} Linear4bit layers"
            if name == "lora_nf4":
                extra += (
                    f"; {record.get('trainable_parameters'):,} trainable parameters, {record.get('lora_parameters'):,} of them LoRA; "
                    f"{record.get('lora_b_trained')} of {record.get('lora_b_tensors')} LoRA B tensors trained"
                )
            lines.append(extra + ".")
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
