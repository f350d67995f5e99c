"""A tiny random Qwen3 decoder with an in-process BPE tokenizer and a ChatML template, saved as a folder.

Loads through the same resolver as real models (a local path), runs forward + backward in milliseconds,
so tests of padding, masks, gradients, checkpoints and DDP exercise the real code paths on CPU.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from qgmem_train.llm.prompts import FINAL_ANSWER

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def save_tiny_decoder(folder: Path, corpus: list[str], hidden_size: int = 64, seed: int = 0) -> Path:
    """Train a byte-level BPE on the final-answer prompt plus ``corpus``; save it with a random Qwen3 model."""
    folder.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([FINAL_ANSWER.system, FINAL_ANSWER.user, *corpus], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, chat_template=CHATML
    )
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


FIXTURE = Path(__file__).parent / "data" / "trajectories"
"""The committed trajectory fixture (LoCoMo sample; tests only)."""


def fixture_corpus() -> list[str]:
    """Texts of the committed trajectory fixture, so the tiny tokenizer has words for them."""
    from qgmem_train.model.trajectory import read_trajectory_dataset

    return [
        text
        for part in read_trajectory_dataset(FIXTURE).values()
        for ex in part
        for text in (ex.question, ex.context, ex.target_json())
    ]


def tiny_module_kwargs(llm_dir: Path, feature_dim: int, **overrides: object) -> dict[str, object]:
    """Settings of a GraphAugmentedLM over the tiny decoder: small encoder, short context, short generations."""
    settings: dict[str, object] = dict(
        feature_dim=feature_dim, llm=str(llm_dir), gnn_hidden=32, gnn_layers=2, gnn_heads=2, projector_hidden=32,
        max_context_tokens=48, max_new_tokens=32, learning_rate=1e-2, weight_decay=0.0,
    )
    settings.update(overrides)
    return settings
