"""Sentence embedder for dense retrieval, SemMatch, traces and graph features."""

from __future__ import annotations

import os

import numpy as np

from qgmem_train.llm.resolver import pick_device, resolve_model_dir


class Embedder:
    """A sentence-transformers model returning float32, L2-normalised rows; ``dim`` comes from the model."""

    def __init__(
        self,
        ref: str,
        *,
        revision: str | None = None,
        device: str = "auto",
        cache_dir: str | os.PathLike | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        from sentence_transformers import SentenceTransformer

        self.model_id = ref
        self.revision = revision
        folder = resolve_model_dir(ref, cache_dir, revision=revision)
        self.model = SentenceTransformer(str(folder), device=pick_device(device), trust_remote_code=trust_remote_code)
        self.dim: int = int(self.model.get_embedding_dimension())

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Embeddings of ``texts`` as a ``(len(texts), dim)`` float32 array with unit-norm rows."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self.model.encode(
            list(texts), batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=len(texts) > 10 * batch_size
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)
