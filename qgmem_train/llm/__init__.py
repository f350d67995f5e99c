"""Model backends behind one small interface: chat LLMs (local transformers or OpenAI-compatible HTTP) and the embedder.

Public names: :class:`~qgmem_train.llm.base.ChatLLM` (the interface), :class:`~qgmem_train.llm.local.TransformersLLM`,
:class:`~qgmem_train.llm.http.OpenAICompatibleLLM`, :class:`~qgmem_train.llm.embedder.Embedder`,
:func:`~qgmem_train.llm.factory.build_llm` and :func:`~qgmem_train.llm.factory.build_embedder` (one per config and
process), the paper's prompts (:mod:`~qgmem_train.llm.prompts`), the stages' output schemas
(:mod:`~qgmem_train.llm.schemas`) and schema-valid generation (:func:`~qgmem_train.llm.structured.generate_structured`).
"""
