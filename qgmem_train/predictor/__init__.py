"""The bundled predictor: load an exported QGMem model, keep a user's memory, answer with cited evidence.

``QGMemPredictor.from_pretrained(folder_or_repo_id)`` verifies the export (every file checksummed, its
config.json free of settings only the caller may choose), rebuilds the graph-augmented LM from its saved
hyperparameters and loads exactly the exported adapter parameters. ``predictor.memory(namespace,
store_dir)`` is a handle over a persistent memory store: ``add_session`` extends it, ``ask`` answers.

The question's walk (models, search, text-path answer, the results ``ask`` returns) is :mod:`qgmem_train.pipeline`'s; the
predictor adds the exported model and its graph-token answer. Modules, each importing only those before it:
:mod:`~qgmem_train.predictor.artifact` (the export format and its trust boundary),
:mod:`~qgmem_train.predictor.base` (what a memory handle needs of its predictor),
:mod:`~qgmem_train.predictor.memory` (memory handles: add sessions, ask),
:mod:`~qgmem_train.predictor.loading` (the predictor and module loading).
"""

from qgmem_train.predictor.artifact import (
    CALLER_MODELS,
    CALLER_MODULE,
    CARD_FILE,
    CHECKSUM_FILE,
    CONFIG_FILE,
    EXPORT_FORMAT,
    EXPORT_FORMAT_VERSION,
    HUB_PATTERNS,
    LORA_CONFIG_FILE,
    LORA_WEIGHTS_FILE,
    MACHINE_MODELS,
    MACHINE_MODULE,
    PROMPTS_FILE,
    Export,
    check_base_url,
    file_sha256,
    locate_export,
    portable_models,
    portable_module,
    read_checksums,
    read_export,
    verify_checksums,
)
from qgmem_train.predictor.base import MAX_QUESTION_CHARS, IntentMode, Predictor
from qgmem_train.predictor.loading import QGMemPredictor, ask_with_model, load_exported_module
from qgmem_train.predictor.memory import PredictorMemory, ask_batch
from qgmem_train.pipeline.results import AskResult, EvidenceUnit, SearchResult, SourceTurn

__all__ = [
    "CALLER_MODELS",
    "CALLER_MODULE",
    "CARD_FILE",
    "CHECKSUM_FILE",
    "CONFIG_FILE",
    "EXPORT_FORMAT",
    "EXPORT_FORMAT_VERSION",
    "HUB_PATTERNS",
    "LORA_CONFIG_FILE",
    "LORA_WEIGHTS_FILE",
    "MACHINE_MODELS",
    "MACHINE_MODULE",
    "MAX_QUESTION_CHARS",
    "PROMPTS_FILE",
    "AskResult",
    "EvidenceUnit",
    "Export",
    "IntentMode",
    "Predictor",
    "PredictorMemory",
    "QGMemPredictor",
    "SearchResult",
    "SourceTurn",
    "ask_batch",
    "ask_with_model",
    "check_base_url",
    "file_sha256",
    "load_exported_module",
    "locate_export",
    "portable_models",
    "portable_module",
    "read_checksums",
    "read_export",
    "verify_checksums",
]
