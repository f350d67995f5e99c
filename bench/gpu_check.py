"""GPU check of training on one CUDA device: the CUDA tests, checkpointing, the prefix cache, NF4 and LoRA on NF4 timed in alternated rounds, predict.

Six parts, each in its own try block (a failing part reports its error line and the others still run);
``bench/results/gpu.json`` and ``gpu.md`` are rewritten after every part. ``scripts/gpu_check.sh`` runs each
part in its own process under its own time limit (``--part``, ``--run-id``) and records a killed part (``--mark``).

1. ``tests``: ``pytest -m gpu`` over the test files that carry the marker, on this check's LLM and embedder (the
   stand-ins below where the bundled packages are missing).
2. ``bf16``: configs/demo-cpu.yaml's model settings over the timed backbone (a random decoder of Qwen3-8B's widths with
   ``--standin-layers`` layers and the check's tokenizer, built once from config: :meth:`Bench.timed_backbone`) in bf16
   autocast, contexts cut to ``--seq-tokens`` (``model.prompt.max_context_tokens``), gradient checkpointing off vs on:
   training steps alternated for ``--rounds`` rounds in one process (``gpu_module_steps.py``), device time (CUDA events) apart from host preparation,
   peak CUDA memory (``torch.cuda.max_memory_allocated``) and decoder-layer passes a step.
3. ``prefix_cache``: the frozen-prefix cache on a random Qwen3-8B-shaped decoder in bf16 (``gpu_prefix_timing.py``): the
   decoder step's device time off, on with transformers' explicit mask, on with the bottom-right causal bias, alternated
   for ``--rounds`` rounds at ``--cache-tokens`` tokens, batch 4 and 1; fp32 first-step logits of each cached variant
   against those without the cache within 1e-4 relative; and the attention call alone for the same three cases.
4. ``nf4``: the timed backbone in bf16 vs in 4-bit NF4 (``quantization: 4bit``), alternated as ``bf16``; 4-bit layers, load time.
5. ``lora_nf4``: the NF4 backbone without vs with LoRA (``model.lora.r: 8``), alternated as ``bf16``; the LoRA B tensors train.
6. ``predict``: ``--predict-fit-steps`` of training, then ``Trainer.predict`` on ``--predict-examples`` examples:
   schema-valid rate, exact match and seconds.

The parts' helpers live beside this entry point: ``gpu_timing.py`` (device clock, alternated rounds, ratios),
``gpu_module_steps.py`` (the module's training steps), ``gpu_prefix_timing.py`` (the prefix-cache part),
``gpu_standins.py`` (random-weight stand-ins, slim wheels) and ``gpu_report.py`` (``gpu.md``); docs/gpu-check.md says
what each part measures.

``--smoke`` runs the same code on CPU (one step a round, short contexts, a tiny timed backbone; ``--llm`` may name a tiny decoder):
the marked tests run on CPU where they can (bf16; NF4 skips itself) and the NF4 parts report ``skipped: no CUDA``. Without CUDA and without ``--smoke`` nothing is
measured or written, so ``bench/run_all.py`` (which finds this file too) leaves the GPU results alone.

Models that cannot travel to a machine without network (the bundled SmolLM2 GGUF and MiniLM are about 90 MB
each) are replaced by random weights of the same architecture and tokenizer: ``--export-models DIR`` (here)
keeps their configs and tokenizers, ``--models DIR`` (there) builds the stand-ins once. Step time and memory
do not depend on the weights; the predict part then checks the generation path, not answer quality.

    scripts/gpu_check.sh                                   # on the GPU machine: every part, within 7 minutes
    python bench/gpu_check.py --smoke --out /tmp/gpu.json  # the CPU check of this script
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from bench.gpu_module_steps import time_module_variants
from bench.gpu_report import PARTS, load_results, status_line, write
from bench.gpu_standins import export_models, resolve_or_standin, shaped_standin, slim_wheel
from qgmem_train.reports import machine_info

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "gpu.json"
GIB = 1024**3
STANDIN_LAYERS = 4
"""Decoder layers of the Qwen3-8B-shaped backbone the bf16, nf4 and lora_nf4 parts time (``--standin-layers``)."""


class Skipped(Exception):
    """A part that has nothing to run here; the message says why."""


class PartFailed(Exception):
    """A part that ran and failed a check; ``details`` keeps what it measured."""

    def __init__(self, message: str, details: dict[str, Any]) -> None:
        super().__init__(message)
        self.details = details


def lengthen(context: str, pool: list[str], tokens: int) -> str:
    """``context`` followed by the other contexts of ``pool`` until it surely holds more than ``tokens`` tokens (6 characters each)."""
    parts = [context]
    for other in pool:
        if sum(map(len, parts)) > 6 * tokens:
            break
        if other != context:
            parts.append(other)
    return "\n\n".join(parts)


def device_arguments(cuda: bool) -> dict[str, Any]:
    """The Trainer's device settings: one GPU in bf16 autocast, or one CPU process in float32 (smoke)."""
    if cuda:
        return {"accelerator": "gpu", "devices": 1, "precision": "bf16-mixed"}
    return {"accelerator": "cpu", "devices": 1, "precision": "32-true"}


def make_probe(cuda: bool) -> Any:
    """A Lightning callback that records each training step's loss and the seconds from setup to the first step."""
    import lightning as L
    import torch

    class FitProbe(L.Callback):
        """Losses a step and load seconds (setup to the first step, synchronised)."""

        def __init__(self) -> None:
            self.losses: list[float] = []
            self.load_s: float | None = None
            self._started = 0.0

        def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
            self._started = time.perf_counter()

        def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            if cuda:
                torch.cuda.synchronize()
            self.load_s = time.perf_counter() - self._started

        def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            self.losses.append(float(loss))

        def summary(self) -> dict[str, Any]:
            return {
                "steps": len(self.losses), "load_s": self.load_s, "loss_first": self.losses[0] if self.losses else None,
                "loss_last": self.losses[-1] if self.losses else None, "losses_finite": all(math.isfinite(x) for x in self.losses),
            }  # fmt: skip

    return FitProbe()


def free_memory(cuda: bool) -> None:
    """Collect garbage and hand cached CUDA blocks back, so the next part starts from a clean slate."""
    gc.collect()
    if cuda:
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


class Bench:
    """Data, model settings and the fit helper shared by the parts (built lazily: the ``tests`` part needs none)."""

    def __init__(self, args: argparse.Namespace, cuda: bool) -> None:
        self.args, self.cuda = args, cuda
        self._data: Any = None
        self._backbone: str | None = None
        self.models: dict[str, str] = {}
        self.llm, self._embedder = args.llm, args.embedder

    def data(self) -> Any:
        """The trajectory fixture, each context lengthened by the others' until ``max_context_tokens`` is what cuts it."""
        if self._data is None:
            from qgmem_train.model.datamodule import TrajectoryDataModule

            data = TrajectoryDataModule(
                str(self.args.data), embedder=self.model_refs()["embedder"], batch_size=self.args.batch_size, eval_batch_size=self.args.batch_size
            )
            data.setup("fit")
            pool = [ex.context for part in data.splits.values() for ex in part]
            tokens = self.args.seq_tokens
            data.splits = {name: [replace(ex, context=lengthen(ex.context, pool, tokens)) for ex in part] for name, part in data.splits.items()}
            self._data = data
        return self._data

    def model_refs(self) -> dict[str, str]:
        """The LLM and embedder every part uses: the given ones where they resolve, else the prepared stand-ins."""
        if not self.models:
            self.llm, self.models["llm"] = resolve_or_standin(self.args.llm, "llm", self.args.models)
            self._embedder, self.models["embedder"] = resolve_or_standin(self.args.embedder, "embedder", self.args.models)
        return {"llm": self.llm, "embedder": self._embedder}

    def timed_shape(self) -> tuple[dict[str, Any], Any, str]:
        """The timed parts' backbone shape, dtype and device: :data:`QWEN3_8B`'s widths in bf16 on CUDA; the smoke run's tiny
        :data:`SMOKE` shape in fp32 on CPU."""
        import torch

        from bench.gpu_prefix_timing import QWEN3_8B, SMOKE

        return (QWEN3_8B, torch.bfloat16, "cuda") if self.cuda else (SMOKE, torch.float32, "cpu")

    def timed_backbone(self) -> str:
        """The folder of the timed parts' backbone: :meth:`timed_shape` with ``--standin-layers`` layers, random weights, this
        check's tokenizer; built once and kept in ``--models`` (else the temp folder), so the parts' processes share one build."""
        if self._backbone is None:
            shape, dtype, device = self.timed_shape()
            root = (self.args.models or Path(tempfile.gettempdir()) / "qgmem_gpu_check") / "shaped"
            self._backbone = str(shaped_standin(self.model_refs()["llm"], shape, self.args.standin_layers, dtype, device, root))
        return self._backbone

    def backbone_record(self) -> dict[str, Any]:
        """The timed parts' backbone for the results: its shape's name and the sizes of its config."""
        config = json.loads((Path(self.timed_backbone()) / "config.json").read_text())
        sizes = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "num_hidden_layers", "vocab_size")
        return {"shape": "Qwen3-8B" if self.cuda else "tiny Qwen3 (smoke)", "weights": "random", **{k: config[k] for k in sizes}}

    def module_settings(self, **overrides: Any) -> dict[str, Any]:
        """configs/demo-cpu.yaml's model section with this check's overrides, reduced to what the module accepts."""
        from qgmem_train.model.module import GraphAugmentedLM
        from qgmem_train.model.settings import merge_settings

        config = yaml.safe_load((ROOT / "configs" / "demo-cpu.yaml").read_text())["model"]
        check = {
            "feature_dim": self.data().feature_dim,
            "llm": self.llm,
            "dtype": "bfloat16" if self.cuda else "float32",
            "prompt": {"max_context_tokens": self.args.seq_tokens},
            "generation": {"max_new_tokens": self.args.max_new_tokens, "val_generate": False},
        }
        settings = merge_settings(merge_settings(config, check), overrides)
        accepted = inspect.signature(GraphAugmentedLM.__init__).parameters
        return {k: v for k, v in settings.items() if k in accepted}

    def fit(self, steps: int, after: Any = None, **overrides: Any) -> dict[str, Any]:
        """Fit a fresh module for ``steps`` optimizer steps; the probe's summary plus ``after(model, run_dir)``'s result."""
        import lightning as L

        from qgmem_train.model.module import GraphAugmentedLM

        L.seed_everything(self.args.seed, verbose=False)
        model = GraphAugmentedLM(**self.module_settings(**overrides))
        probe = make_probe(self.cuda)
        with tempfile.TemporaryDirectory() as root:
            trainer = L.Trainer(
                **device_arguments(self.cuda), max_steps=steps, logger=False, enable_checkpointing=False, enable_model_summary=False,
                enable_progress_bar=False, limit_val_batches=0, num_sanity_val_steps=0, gradient_clip_val=1.0, callbacks=[probe],
                default_root_dir=root,
            )  # fmt: skip
            trainer.fit(model, datamodule=self.data())
            result = probe.summary()
            if after is not None:
                result.update(after(model, root))
        del model, trainer, probe
        free_memory(self.cuda)
        return result


def gpu_test_files() -> list[str]:
    """Test files that carry the ``gpu`` marker (only these are collected, so other tests' imports cannot fail the part)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if "mark.gpu" in p.read_text())


def part_tests(bench: Bench) -> dict[str, Any]:
    """``pytest -m gpu`` over the marked test files on this check's models: the summary line and any failures.

    The tests take the LLM and embedder (stand-ins where the bundled packages are missing) from
    ``QGMEM_GPU_TEST_LLM`` / ``QGMEM_GPU_TEST_EMBEDDER``; the smoke run on CPU sets ``QGMEM_GPU_TEST_DEVICE=cpu``
    so the tests that can run there do (NF4 skips itself).
    """
    files = gpu_test_files()
    if not files:
        raise PartFailed("no test file carries the gpu marker", {})
    refs = bench.model_refs()
    env = {**os.environ, "QGMEM_GPU_TEST_LLM": refs["llm"], "QGMEM_GPU_TEST_EMBEDDER": refs["embedder"]}
    if not bench.cuda:
        env["QGMEM_GPU_TEST_DEVICE"] = "cpu"
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rfE", *files]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=bench.args.tests_timeout)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    details = {
        "command": " ".join(["python", *command[1:]]),
        "exit_code": result.returncode,
        "summary": lines[-1].strip("= ") if lines else (result.stderr.strip().splitlines() or ["no output"])[-1],
        "failures": [line for line in lines if line.startswith(("FAILED", "ERROR"))][:20],
    }
    if result.returncode != 0:
        raise PartFailed(f"pytest exit {result.returncode}: {details['summary']}", details)
    return details


def part_bf16(bench: Bench) -> dict[str, Any]:
    """Training steps with gradient checkpointing off and on, alternated: device time, peak memory, decoder-layer passes a step."""
    details = time_module_variants(bench, {"off": {"gradient_checkpointing": False}, "on": {"gradient_checkpointing": True}})
    details["precision"] = device_arguments(bench.cuda)["precision"]
    on = details["variants"]["on"]
    if on["decoder_layer_calls_per_step"] is not None and on["decoder_layer_calls_per_step"] < 1.5:
        raise PartFailed("checkpointing on, yet each decoder layer ran once a step: nothing was recomputed in backward", details)
    return details


def part_prefix_cache(bench: Bench) -> dict[str, Any]:
    """The frozen-prefix cache on a random Qwen3-8B-shaped decoder (:mod:`gpu_prefix_timing`): fp32 first-step logits with vs
    without it, decoder step device time off vs on alternated over rounds at batch 4 and 1, and the attention call alone."""
    import torch
    from bench.gpu_prefix_timing import LOGITS_TOLERANCE, QWEN3_8B, SMOKE, TARGET_TOKENS, first_step_logits_difference, random_decoder, time_attention, time_prefix_cache

    from qgmem_train.model.backbone import describe_backbone
    from qgmem_train.model.module import _probe_example
    from qgmem_train.model.prompt_tokens import PromptTokens

    args, cuda = bench.args, bench.cuda
    shape, device = (QWEN3_8B, "cuda") if cuda else (SMOKE, "cpu")
    tokenizer = describe_backbone(bench.model_refs()["llm"], None, None, False).tokenizer
    prefix = PromptTokens(tokenizer, None, False).prompt(_probe_example()).graph_slot
    details: dict[str, Any] = {"shape": "Qwen3-8B" if cuda else "tiny Qwen3 (smoke)", "prefix_tokens": prefix, "rounds": args.rounds}
    if args.cache_tokens < prefix + 2 * TARGET_TOKENS:
        raise PartFailed(f"--cache-tokens {args.cache_tokens} leaves too few tokens after the {prefix}-token prefix for a target", details)
    check = random_decoder(shape, args.logit_layers, torch.float32, device)
    details["first_step_logits_relative_difference"] = first_step_logits_difference(check, 2, args.cache_tokens, prefix)
    del check
    free_memory(cuda)
    llm = random_decoder(shape, None, torch.bfloat16 if cuda else torch.float32, device)
    details["steps"] = [
        time_prefix_cache(llm, batch, args.cache_tokens, prefix, args.rounds, args.steps, args.warmup_steps, cuda) for batch in (4, 1)
    ]
    del llm
    free_memory(cuda)
    details["attention"] = {f"batch {b}": time_attention(b, args.cache_tokens, prefix, shape, args.rounds, args.steps, cuda) for b in (4, 1)}
    for name, difference in details["first_step_logits_relative_difference"].items():
        if difference > LOGITS_TOLERANCE:
            raise PartFailed(f"fp32 first-step logits differ by {difference:.1e} relative with the {name.removeprefix('cache on, ')}", details)
    return details


def count_4bit_layers(model: Any) -> dict[str, Any]:
    """How many linear layers of the backbone bitsandbytes holds in 4 bits."""
    return {"linear_4bit_layers": sum(type(m).__name__ == "Linear4bit" for m in model.llm.modules())}


def losses_finite(details: dict[str, Any]) -> dict[str, Any]:
    """``details`` when every variant's training losses were finite, else :class:`PartFailed` naming the variant."""
    for name, variant in details["variants"].items():
        if not variant["losses_finite"]:
            raise PartFailed(f"{name}: a training loss was not finite", details)
    return details


def part_nf4(bench: Bench) -> dict[str, Any]:
    """The backbone in bf16 and in 4-bit NF4, alternated: load time, 4-bit layer count, device time, memory, finite losses."""
    if not bench.cuda:
        raise Skipped("no CUDA")
    details = time_module_variants(bench, {"bf16": {}, "nf4": {"quantization": "4bit"}}, after=count_4bit_layers)
    if not details["variants"]["nf4"]["linear_4bit_layers"]:
        raise PartFailed("quantization 4bit loaded no Linear4bit layer", details)
    return losses_finite(details)


def lora_state(model: Any) -> dict[str, Any]:
    """4-bit layers, trainable and LoRA parameters, and how many ``lora_B`` tensors moved from peft's zero initialisation."""
    details = count_4bit_layers(model)
    lora_b = [p for name, p in model.named_parameters() if "lora_B" in name]
    details.update(
        trainable_parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
        lora_parameters=sum(p.numel() for name, p in model.named_parameters() if "lora_" in name),
        lora_b_tensors=len(lora_b),
        lora_b_trained=sum(bool(p.detach().abs().sum() > 0) for p in lora_b),
    )
    return details


def part_lora_nf4(bench: Bench) -> dict[str, Any]:
    """The NF4 backbone without and with LoRA r=8, alternated: the adapters train (``lora_B`` leaves zero), losses stay finite."""
    if not bench.cuda:
        raise Skipped("no CUDA")
    variants = {"nf4": {"quantization": "4bit"}, "nf4 + LoRA": {"quantization": "4bit", "lora": {"r": 8}}}
    details = time_module_variants(bench, variants, after=lora_state)
    lora = details["variants"]["nf4 + LoRA"]
    if not lora["lora_b_tensors"] or not lora["lora_b_trained"]:
        raise PartFailed(f"{lora['lora_b_trained']} of {lora['lora_b_tensors']} LoRA B tensors changed in training", details)
    return losses_finite(details)


def part_predict(bench: Bench) -> dict[str, Any]:
    """A short fit, then ``Trainer.predict`` over a few examples: schema-valid rate, answer scores and seconds."""
    import lightning as L
    import torch

    data = bench.data()
    saved = data.splits["test"]
    examples = (data.splits["test"] + data.splits["validation"] + data.splits["train"])[: bench.args.predict_examples]

    def predict(model: Any, root: str) -> dict[str, Any]:
        trainer = L.Trainer(
            **device_arguments(bench.cuda), logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=root
        )
        data.splits["test"] = examples
        try:
            if bench.cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            batches = trainer.predict(model, datamodule=data)
            if bench.cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        finally:
            data.splits["test"] = saved
        records = [record for batch in batches for record in batch]
        mean = lambda key: sum(float(r.get(key) or 0) for r in records) / max(len(records), 1)  # noqa: E731
        return {
            "examples": len(records),
            "predict_s": seconds,
            "s_per_example": seconds / max(len(records), 1),
            "schema_valid": mean("valid_json"),
            "exact_match": mean("exact_match"),
            "f1": mean("f1"),
            "max_new_tokens": model.generation_args.max_new_tokens,
            "sample": records[0]["generated"][:300] if records else None,
        }

    details = bench.fit(bench.args.predict_fit_steps, after=predict)
    if details["examples"] != len(examples):
        raise PartFailed(f"{details['examples']} predictions for {len(examples)} examples", details)
    return details


PART_FUNCTIONS = {
    "tests": part_tests, "bf16": part_bf16, "prefix_cache": part_prefix_cache, "nf4": part_nf4, "lora_nf4": part_lora_nf4,
    "predict": part_predict,
}  # fmt: skip


def error_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (what a reader needs to know which part broke and how)."""
    message = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {message[0] if message else ''}".rstrip(": ")[:300]


def run_part(name: str, bench: Bench) -> dict[str, Any]:
    """One part in its own try block: ok, skipped or failed, with seconds and whatever it measured."""
    start = time.perf_counter()
    try:
        record = {"status": "ok", **PART_FUNCTIONS[name](bench)}
    except Skipped as exc:
        record = {"status": "skipped", "reason": str(exc)}
    except PartFailed as exc:
        record = {"status": "failed", "error": str(exc), **exc.details}
    except Exception as exc:
        record = {"status": "failed", "error": error_line(exc), "traceback": traceback.format_exc().splitlines()[-25:]}
    record["seconds"] = round(time.perf_counter() - start, 1)
    if bench.models and record["status"] != "skipped":
        record["models"] = dict(bench.models)
    free_memory(bench.cuda)
    return record


def environment(cuda: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Machine, GPU, library versions, commit and the settings of this run."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    info: dict[str, Any] = {"machine": machine_info(), "cuda_available": cuda, "torch_cuda": torch.version.cuda}
    if cuda:
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gib=round(props.total_memory / GIB, 1), gpu_count=torch.cuda.device_count())
    versions = {}
    for package in ("lightning", "transformers", "peft", "bitsandbytes", "torch-geometric", "sentence-transformers"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "not installed"
    info["versions"] = versions
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        info["commit"] = commit.stdout.strip() or "unknown (no git checkout)"
    except OSError:
        info["commit"] = "unknown"
    info["settings"] = {k: str(v) for k, v in vars(args).items() if k not in ("part", "mark", "timed_out", "note", "export_models")}
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run (CPU-friendly): 2 steps, short contexts, 2 predictions")
    parser.add_argument("--part", nargs="+", choices=PARTS, help="only these parts (default: all)")
    parser.add_argument("--run-id", help="merge into the results file of this run instead of starting a new one")
    parser.add_argument("--mark", choices=PARTS, help="record that this part ended without recording a result (why: --note)")
    parser.add_argument("--timed-out", action="store_true", help="--mark's part was killed at its time limit")
    parser.add_argument("--note", default="killed", help="why --mark's part ended, e.g. 'exited with code 139'")
    parser.add_argument("--export-models", type=Path, metavar="DIR", help="write the LLM's and embedder's configs and tokenizers to DIR, then exit")
    parser.add_argument("--slim-wheel", type=Path, metavar="WHEEL", help="drop WHEEL's native libraries for CUDA versions other than --cuda's, then exit")
    parser.add_argument("--cuda", default="13", help="--slim-wheel: the CUDA major version to keep (the H200 image's: 13)")
    parser.add_argument("--models", type=Path, metavar="DIR", help="exported configs for random-weight stand-ins of models that do not resolve here")
    parser.add_argument("--llm", default=None, help="LLM reference (default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--embedder", default=None, help="embedder reference (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--data", type=Path, default=ROOT / "tests" / "data" / "trajectories")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--seq-tokens", type=int, help="model.prompt.max_context_tokens (default 1000; smoke 32)")
    parser.add_argument("--steps", type=int, help="timed steps of each variant a round (default 8; smoke 1)")
    parser.add_argument("--warmup-steps", type=int, help="untimed steps of each variant before them, every round (default 2; smoke 0)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds the variants of a timed part alternate for (a verdict needs 5)")
    parser.add_argument("--standin-layers", type=int, help="bf16, nf4, lora_nf4: decoder layers of the Qwen3-8B-shaped backbone (default 4; smoke 2)")
    parser.add_argument("--cache-tokens", type=int, help="prefix_cache: tokens a sequence (default 600; smoke 360)")
    parser.add_argument("--logit-layers", type=int, help="prefix_cache: decoder layers of the fp32 logits check (default 4; smoke all)")
    parser.add_argument("--predict-fit-steps", type=int, help="training steps before predict (default 20; smoke 1)")
    parser.add_argument("--predict-examples", type=int, help="examples to predict (default 8; smoke 2)")
    parser.add_argument("--max-new-tokens", type=int, help="generation budget (default: demo-cpu.yaml's; smoke 32)")
    parser.add_argument("--tests-timeout", type=int, help="seconds for pytest -m gpu (default 240; smoke 540, under its 600 s limit)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help=f"results JSON, Markdown beside it (default {DEFAULT_OUT.relative_to(ROOT)}; smoke: a temp folder)")
    args = parser.parse_args(argv)
    if args.slim_wheel:
        before = args.slim_wheel.stat().st_size
        dropped = slim_wheel(args.slim_wheel, args.cuda)
        print(f"{args.slim_wheel.name}: dropped {dropped} libraries for CUDA other than {args.cuda}.x ({before / 2**20:.1f} -> {args.slim_wheel.stat().st_size / 2**20:.1f} MiB)")
        return 0

    from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM

    args.llm, args.embedder = args.llm or BUNDLED_LLM, args.embedder or BUNDLED_EMBEDDER
    if args.export_models:
        print(json.dumps(export_models(args.llm, args.embedder, args.export_models), indent=2))
        return 0
    demo_new_tokens = yaml.safe_load((ROOT / "configs" / "demo-cpu.yaml").read_text())["model"]["generation"]["max_new_tokens"]
    defaults = (
        dict(
            batch_size=2, seq_tokens=32, steps=1, warmup_steps=0, predict_fit_steps=1, predict_examples=2, max_new_tokens=32, cache_tokens=360,
            standin_layers=2, tests_timeout=540,
        )
        if args.smoke
        else dict(
            batch_size=4, seq_tokens=1000, steps=8, warmup_steps=2, predict_fit_steps=20, predict_examples=8, max_new_tokens=demo_new_tokens,
            cache_tokens=600, logit_layers=4, standin_layers=STANDIN_LAYERS, tests_timeout=240,
        )
    )
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    out = args.out or (Path(tempfile.gettempdir()) / "qgmem_gpu_check" / "gpu.json" if args.smoke else DEFAULT_OUT)

    if args.mark:
        result = load_results(out, args.run_id)
        if result["parts"].get(args.mark, {}).get("status") in (None, "running"):
            result["parts"][args.mark] = {"status": "timed out" if args.timed_out else "failed", "error": args.note}
            write(result, out)
        return 0

    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("gpu_check: no CUDA device here; nothing measured or written (run scripts/gpu_check.sh on a GPU machine, --smoke on CPU)")
        return 0
    result = load_results(out, args.run_id)
    result.update(smoke=args.smoke, environment=environment(cuda, args))
    bench = Bench(args, cuda)
    for name in args.part or PARTS:
        result["parts"][name] = {"status": "running"}
        write(result, out)
        print(f"== {name}", flush=True)
        result["parts"][name] = run_part(name, bench)
        print(f"   {status_line(result['parts'][name])}", flush=True)
        write(result, out)
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0 if all(r["status"] in ("ok", "skipped") for r in result["parts"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
