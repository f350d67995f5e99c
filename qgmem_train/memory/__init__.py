"""Memory construction and storage (paper III-A): conversations cut into windows, units extracted and embedded, traces.

Public names: :class:`~qgmem_train.memory.store.MemoryStore` (SQLite or PostgreSQL; ``load_namespace`` gives a
:class:`~qgmem_train.memory.store.NamespaceMemory`), :func:`~qgmem_train.memory.construct.build_conversation` (build or
extend a namespace), the data model (:mod:`~qgmem_train.memory.types`: ``Turn``, ``Session``, ``Conversation``,
``MemoryUnit``, ``Trace``), the dataset loaders (:func:`~qgmem_train.memory.loaders.load_conversations`) and date
resolution (:mod:`~qgmem_train.memory.timeparse`). Nothing here imports retrieval.
"""
