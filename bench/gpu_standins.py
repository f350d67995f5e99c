"""The GPU check's model stand-ins: configs and tokenizers exported here, random weights built there, and slim wheels.

Models that cannot travel to a machine without network (the bundled SmolLM2 GGUF and MiniLM are about 90 MB each)
are replaced by random weights of the same architecture and tokenizer; step time and memory do not depend on them.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.gguf", "*.pt", "*.onnx")


def export_models(llm: str, embedder: str, out: Path) -> dict[str, str]:
    """Copy the configs and tokenizers (no weights) of ``llm`` and ``embedder`` to ``out/llm`` and ``out/embedder``."""
    from qgmem_train.llm.resolver import resolve_model_dir

    written = {}
    for kind, ref in (("llm", llm), ("embedder", embedder)):
        source, target = resolve_model_dir(ref), out / kind
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target, ignore=shutil.ignore_patterns(*WEIGHT_FILES, "README.md"))
        (target / "STANDIN.json").write_text(json.dumps({"reference": ref, "weights": "none: random stand-ins are built from this"}) + "\n")
        written[kind] = str(target)
    return written


CUDA_LIBRARY = re.compile(r"_cuda(\d+)\.(?:so|dll|dylib)$")


def slim_wheel(wheel: Path, cuda_major: str) -> int:
    """Rewrite ``wheel`` without its native libraries for CUDA versions outside ``cuda_major`` (RECORD to match).

    bitsandbytes ships one library per CUDA version (over 40 MB compressed); the GPU machine loads its own CUDA's
    alone, and what travels there has a size limit. Returns how many libraries were dropped.
    """
    def kept(name: str) -> bool:
        found = CUDA_LIBRARY.search(name)
        return found is None or found.group(1).startswith(cuda_major)

    staging = wheel.with_name(f".{wheel.name}.slim")
    dropped = 0
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(staging, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            if not kept(info.filename):
                dropped += 1
                continue
            data = source.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = "".join(line for line in data.decode().splitlines(keepends=True) if kept(line.split(",")[0])).encode()
            target.writestr(info, data)
    staging.replace(wheel)
    return dropped


def standin_model(kind: str, models: Path) -> Path:
    """A folder with random weights for the exported ``models/<kind>`` (built once into ``models/<kind>-random``)."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    source, final = models / kind, models / f"{kind}-random"
    if final.exists():
        return final
    if not (source / "config.json").exists():
        raise FileNotFoundError(f"{source}/config.json: no exported {kind} (run --export-models {models} where the models resolve)")
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=models))
    try:
        shutil.copytree(source, staging, dirs_exist_ok=True)
        torch.manual_seed(0)
        config = AutoConfig.from_pretrained(source)
        model = (AutoModelForCausalLM if kind == "llm" else AutoModel).from_config(config)
        model.save_pretrained(staging, safe_serialization=True)
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def resolve_or_standin(ref: str, kind: str, models: Path | None) -> tuple[str, str]:
    """``ref`` when it resolves here, else a random-weight stand-in from ``models``; and a note on which."""
    from qgmem_train.errors import ModelUnavailableError
    from qgmem_train.llm.resolver import resolve_model_dir

    try:
        resolve_model_dir(ref)
        return ref, ref
    except ModelUnavailableError as exc:
        if models is None:
            raise
        folder = standin_model(kind, models)
        source = json.loads((models / kind / "STANDIN.json").read_text()).get("reference", "?")
        return str(folder), f"random weights with the architecture and tokenizer of {source} ({str(exc).splitlines()[0]})"


def shaped_config(tokenizer: Any, shape: dict[str, Any], layers: int) -> dict[str, Any]:
    """A Qwen3 config of ``shape`` with ``layers`` decoder layers and ``tokenizer``'s vocabulary and special tokens."""
    config = {**shape, "vocab_size": len(tokenizer), "num_hidden_layers": layers}
    return {**config, **{name: getattr(tokenizer, name) for name in ("bos_token_id", "eos_token_id", "pad_token_id")}}


def shaped_standin(tokenizer_ref: str, shape: dict[str, Any], layers: int, dtype: Any, device: str, root: Path) -> Path:
    """A folder holding a random Qwen3 decoder of ``shape`` with ``layers`` layers and the tokenizer of ``tokenizer_ref``.

    The model loads through the module's own path (bf16, or NF4 by bitsandbytes), so the timed parts run on decoder
    layers of a large model's widths rather than a 135M model's, whose steps are mostly host work. The vocabulary is the
    tokenizer's (the loss reads 40 labelled positions, so its size barely moves a step). Built once under ``root``, in a
    folder named by the tokenizer, shape, layers and dtype, atomically; a folder already there is reused.
    """
    from bench.gpu_prefix_timing import random_decoder
    from qgmem_train.model.backbone import describe_backbone

    tokenizer = describe_backbone(tokenizer_ref, None, None, False).tokenizer
    config = shaped_config(tokenizer, shape, layers)
    key = json.dumps([tokenizer_ref, config, str(dtype)], sort_keys=True)
    final = root / f"qwen3-{layers}-layers-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if final.exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        tokenizer.save_pretrained(staging)
        random_decoder(config, None, dtype, device).save_pretrained(staging, safe_serialization=True)
        (staging / "STANDIN.json").write_text(json.dumps({"tokenizer": tokenizer_ref, "config": config, "weights": "random"}) + "\n")
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final
