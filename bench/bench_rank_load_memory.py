"""Peak host memory of a rank loading the frozen LLM: straight onto its device, against on the CPU first.

Until this change a training rank loaded the backbone on the CPU and then moved it to its GPU, so for a moment every
rank of a node held the whole model in host memory (8 ranks × 16 GB for an 8B model in bf16). ``load_causal_lm`` now
hands the device to ``from_pretrained`` (``device_map``). The stand-in is Qwen3-8B's shape (:data:`QWEN3_8B`) with fewer
decoder layers (all 36 would not fit this machine), zero bf16 weights saved as safetensors (values do not change
memory); the meta device stands in for the rank's GPU (no GPU here): what a rank holds on the host beyond it is what
it would hold with a GPU. Each load runs in a fresh process; the figures are the resident memory it gains by the load,
anonymous and file-backed, and its peak. A report is written as JSON and markdown under ``bench/results``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.gpu_prefix_timing import QWEN3_8B
from qgmem_train.reports import machine_info

CHILD = """
import json, sys
from qgmem_train.llm.resolver import load_causal_lm
import transformers.modeling_utils  # imported before the baseline: its import is not the load
def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))
before = {key: status(key) for key in ("RssAnon", "RssFile")}
model, _ = load_causal_lm(sys.argv[1], device=sys.argv[2], dtype="bfloat16")
if sys.argv[2] == "cpu":  # what .to(its GPU) then does: read every weight once (a value every 2 KB touches each page)
    for p in model.parameters():
        p.detach().view(-1)[::1024].float().sum()
print(json.dumps({"anonymous": status("RssAnon") - before["RssAnon"], "file_backed": status("RssFile") - before["RssFile"], "peak": status("VmHWM")}))
"""


def write_standin(folder: Path, layers: int) -> int:
    """Save a Qwen3-8B-shaped causal LM with ``layers`` decoder layers (zero bf16 weights) and a tokenizer; its weight bytes."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, Qwen3Config

    from qgmem_train.config import BUNDLED_LLM
    from qgmem_train.llm.resolver import resolve_model_dir

    shutil.copytree(resolve_model_dir(BUNDLED_LLM), folder, ignore=shutil.ignore_patterns("*.safetensors", "*.gguf", "*.bin", "config.json"))
    config = Qwen3Config(**{**QWEN3_8B, "num_hidden_layers": layers})
    with torch.device("meta"):
        shapes = {name: p.shape for name, p in AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).state_dict().items()}
    save_file({name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in shapes.items()}, folder / "model.safetensors")
    config.save_pretrained(folder)
    return sum(shape.numel() * 2 for shape in shapes.values())


def resident_growth(folder: Path, device: str) -> dict[str, int]:
    """Bytes of anonymous and of file-backed resident memory a fresh process gains by loading ``folder`` onto ``device``
    (on ``cpu`` it then reads every weight, as the move to its GPU did), and its peak resident bytes (``VmHWM``)."""
    result = subprocess.run([sys.executable, "-c", CHILD, str(folder), device], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="decoder layers of the stand-in (Qwen3-8B has 36)")
    parser.add_argument("--name", default="rank_load_memory", help="report name under bench/results")
    args = parser.parse_args(argv)
    info = machine_info()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "standin"
        weights = write_standin(folder, args.layers)
        growth = {"device (meta for the GPU)": resident_growth(folder, "meta"), "CPU first (the former path)": resident_growth(folder, "cpu")}
    gib = 2**30
    report = {"machine": info, "layers": args.layers, "weight_bytes": weights, "resident_growth_bytes": growth}
    out = Path(__file__).parent / "results"
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    rows = "\n".join(
        f"| {mode} | {v['anonymous'] / gib:.2f} | {v['file_backed'] / gib:.2f} | {(v['anonymous'] + v['file_backed']) / weights:.2f} | {v['peak'] / gib:.2f} |"
        for mode, v in growth.items()
    )
    (out / f"{args.name}.md").write_text(
        f"# A rank's peak host memory while loading the frozen LLM (Qwen3-8B shape, {args.layers} of 36 layers, bf16)\n\n"
        f"Stand-in weights: {weights / gib:.2f} GiB. Machine: {info['cpu']}, {info['cores']} cores, load average "
        f"{info.get('load_average_1m')} at the start; torch {info.get('torch')}.\n\n"
        "| load | anonymous resident gained (GiB) | file-backed resident gained (GiB) | share of the weights | peak resident, whole process (GiB) |\n"
        f"|---|---|---|---|---|\n{rows}\n\n"
        "The meta device stands in for the rank's GPU (none here). On the CPU path the weights are read once, as the move to "
        "the GPU read them; file-backed pages are the safetensors file mapped (page cache, which a node's ranks share when "
        "the file's dtype is the one loaded), anonymous ones the process's own. Made with `python -m "
        f"bench.bench_rank_load_memory --layers {args.layers}`.\n"
    )
    print(json.dumps(growth))
    return 0


if __name__ == "__main__":
    sys.exit(main())
