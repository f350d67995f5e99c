"""A cross-encoder reranker trained on the pipeline's own candidate pools (``python -m qgmem_train fit-reranker``).

:mod:`~qgmem_train.reranker.data` turns LoCoMo questions into gold units and hard negatives from the
fused pool of a turns-mode store; :mod:`~qgmem_train.reranker.module` is the LightningModule (the
bundled MiniLM's BERT encoder plus a fresh scoring head); :mod:`~qgmem_train.reranker.cli` trains it
and saves a sentence-transformers CrossEncoder folder that ``models.reranker: cross`` loads.
"""
