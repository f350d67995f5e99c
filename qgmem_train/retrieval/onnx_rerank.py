"""A sentence-transformers CrossEncoder run by ONNX Runtime on the CPU (``models.reranker_runtime: onnxruntime``).

The graph is exported once from the model folder's weights by torch's exporter, quantized to dynamic int8
by ONNX Runtime when asked, and kept in ``<cache>/onnx/<folder>-<digest of its files>-<fp32|int8>`` with the
SHA-256 of each file it wrote, checked before every use with the entry's owner and permissions (writable by
this user alone); an export therefore never ships an ONNX file, a changed model gets a new graph, and a
changed graph, or one others could have written, is exported again rather than run. Pairs are tokenized by
the CrossEncoder itself and batched by token count, longest first, and the CrossEncoder's activation
is applied to the logits, so the fp32 scores are torch's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from qgmem_train.errors import ModelUnavailableError
from qgmem_train.fileio import checksums_digest, file_sha256, replace_folder, seal_folder, staging_beside, trusted_cache_entry, write_json_atomic
from qgmem_train.logging_setup import is_verbose

log = logging.getLogger(__name__)
GRAPH_FILE = "model.onnx"
DIGESTS_FILE = "sha256.json"
"""``{file name: SHA-256}`` of every file of a cached graph folder, written with it and checked before each use."""


def folder_digest(folder: Path) -> str:
    """Digest of every file under ``folder`` (relative names and contents): a cache key that changes with the model."""
    return checksums_digest({p.relative_to(folder).as_posix(): file_sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()})


@contextmanager
def exporter_chatter_hidden() -> Iterator[None]:
    """Drop log records up to WARNING while a graph is exported and quantized, unless output was made verbose.

    torch's exporter warns through its own handler (operators of packages that are not installed) and
    ONNX Runtime's quantizer through the root logger (a pre-processing hint, which would also give an
    unconfigured root logger a handler); neither concerns someone scoring pairs.
    """
    root = logging.getLogger()
    guard = logging.NullHandler()
    root.addHandler(guard)
    previous = root.manager.disable
    if not is_verbose():
        logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)
        root.removeHandler(guard)


def export_onnx(cross_encoder: Any, target: Path, quantization: str) -> None:
    """Write ``target/model.onnx``: the CrossEncoder's model exported with dynamic batch and sequence axes, int8 when asked."""
    import torch

    names = list(cross_encoder.tokenizer.model_input_names)
    example = cross_encoder.preprocess([("a question", "a document to score"), ("another question", "another")])
    inputs = {name: example[name] for name in names}
    graph = target / GRAPH_FILE
    fp32 = target / "fp32.onnx" if quantization == "int8" else graph
    axes = {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(cross_encoder.model.eval(), (), kwargs=inputs, input_names=names, output_names=["logits"],
                                    dynamic_shapes={name: axes for name in names}, dynamo=True, external_data=False, verbose=False)
        program.save(str(fp32), external_data=False)
    if quantization == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(fp32), str(graph), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True)
        fp32.unlink()


def onnx_graph(cross_encoder: Any, folder: Path, quantization: str, cache_dir: str | os.PathLike | None) -> bytes:
    """The bytes of the model's cached graph, checked against the digests recorded when it was written.

    Exported on first use (a few seconds, one info line); a cached folder whose files no longer match
    their recorded digests (cut short), or that someone else could have written (digests and all), is
    never used: it is exported again, with one warning line; a cache folder others can write is refused.
    The bytes returned are the ones checked, so the file is not read twice.
    """
    from qgmem_train.llm.resolver import default_cache_dir

    precision = "int8" if quantization == "int8" else "fp32"
    final = default_cache_dir(cache_dir) / "onnx" / f"{folder.name}-{folder_digest(folder)}-{precision}"
    graph = recorded_graph(final) if trusted_cache_entry(final) else None
    if graph is not None:
        return graph
    if final.exists():
        log.warning("warning: the cached ONNX graph in %s differs from its recorded digests or is writable by others; exporting it again", final)
    else:
        log.info("exporting the reranker %s to ONNX (%s) once into %s", folder, precision, final)
    with staging_beside(final) as staging:
        with exporter_chatter_hidden():
            export_onnx(cross_encoder, staging, quantization)
        graph = (staging / GRAPH_FILE).read_bytes()
        digests = {p.name: file_sha256(p) for p in sorted(staging.iterdir()) if p.name != GRAPH_FILE}
        write_json_atomic(staging / DIGESTS_FILE, {**digests, GRAPH_FILE: hashlib.sha256(graph).hexdigest()})
        seal_folder(staging)
        replace_folder(staging, final)
    return graph


def recorded_graph(final: Path) -> bytes | None:
    """The graph's bytes when every file of ``final`` matches the digests recorded beside it, else ``None``."""
    try:
        digests = json.loads((final / DIGESTS_FILE).read_text(encoding="utf-8"))
        names = {p.name for p in final.iterdir()} - {DIGESTS_FILE}
        if not isinstance(digests, dict) or names != set(digests) or GRAPH_FILE not in names:
            return None
        if any(file_sha256(final / name) != digest for name, digest in digests.items() if name != GRAPH_FILE):
            return None
        graph = (final / GRAPH_FILE).read_bytes()
    except (OSError, ValueError, RecursionError):
        return None
    return graph if hashlib.sha256(graph).hexdigest() == digests[GRAPH_FILE] else None


def cpu_session(graph: bytes, *, intra_op_threads: int = 1, spinning: bool = False) -> Any:
    """An ONNX Runtime CPU session over ``graph``: ``intra_op_threads`` threads a run, one inter-op thread, and threads
    that sleep between operators unless ``spinning`` (ONNX Runtime's default, kept for comparison)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


class OnnxCrossEncoderReranker:
    """A CrossEncoder's scores from ONNX Runtime on the CPU, its batches side by side on as many threads as torch uses.

    Each batch runs on one intra-op thread and ``workers`` batches run at once (one session; ONNX Runtime's
    ``run`` is thread-safe and releases the GIL): a batch of 8 short pairs is too small to split well over
    cores, and on 2 cores a pool of 100 took 0.85x the time of one batch at a time on 2 intra-op threads, with
    the same scores (bench/results/rerank_batch_threads.md). The threads sleep between operators rather than
    spin (ONNX Runtime's default): spinning threads hold a core the other thread or process needs, which on 2
    shared cores cost a pool of 100 about 1.4x its time (bench/results/rerank_question_time.md).
    """

    name = "cross"

    def __init__(self, ref: str, *, batch_size: int = 8, cache_dir: str | None = None, quantization: str = "none", max_length: int | None = None,
                 workers: int | None = None):
        try:
            import onnxruntime  # noqa: F401  (refused here, in one line, before a model is loaded)
        except ImportError:
            raise ModelUnavailableError("models.reranker_runtime onnxruntime needs the onnxruntime package (pip install onnxruntime), "
                                        "or set it to torch") from None
        import torch

        from qgmem_train.llm.resolver import resolve_model_dir
        from qgmem_train.retrieval.cross_encoder import load_cross_encoder, set_max_length, tokenizer_panics_refused, trained_document_layout

        folder = resolve_model_dir(ref, cache_dir)
        self.model_id = ref
        self.batch_size = batch_size
        self.cross_encoder = load_cross_encoder(folder, ref, "cpu")
        self.document_layout = trained_document_layout(self.cross_encoder, folder)
        set_max_length(self.cross_encoder, max_length, ref)
        self.input_names = list(self.cross_encoder.tokenizer.model_input_names)
        self.workers = workers or torch.get_num_threads()
        self.batch_threads = ThreadPoolExecutor(self.workers, thread_name_prefix="rerank") if self.workers > 1 else None
        with tokenizer_panics_refused(ref):  # the export tokenizes a sample pair
            self.session = cpu_session(onnx_graph(self.cross_encoder, folder, quantization, cache_dir))

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """The cross-encoder's relevance score for every pair, pairs with the most tokens batched together.

        The pool is tokenized in one call (the CrossEncoder's own preprocessing); each batch is cut to
        its longest pair, so no batch carries padding beyond what its own pairs need. A pair's score
        depends only on its batch (int8 activations are quantized per batch), never on the threads.
        """
        import torch

        from qgmem_train.retrieval.cross_encoder import tokenizer_panics_refused

        scores = np.zeros(len(documents), np.float32)
        if not documents:
            return scores
        with tokenizer_panics_refused(self.model_id):
            features = self.cross_encoder.preprocess([(query, d) for d in documents])
        lengths = features["attention_mask"].sum(dim=1).numpy()
        inputs = {name: features[name].numpy() for name in self.input_names}
        right_padded = self.cross_encoder.tokenizer.padding_side == "right"
        order = np.argsort(-lengths, kind="stable")
        batches = [order[start : start + self.batch_size] for start in range(0, len(order), self.batch_size)]

        def logits_of(chosen: np.ndarray) -> np.ndarray:
            width = int(lengths[chosen].max())
            columns = slice(None, width) if right_padded else slice(-width, None)
            return self.session.run(None, {name: values[chosen, columns] for name, values in inputs.items()})[0]

        run = self.batch_threads.map if self.batch_threads is not None else map
        for chosen, logits in zip(batches, run(logits_of, batches)):
            activated = self.cross_encoder.activation_fn(torch.from_numpy(logits))
            scores[chosen] = activated.reshape(len(chosen), -1)[:, 0].numpy()
        return scores
