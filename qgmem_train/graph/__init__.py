"""The local memory graph of a working memory and the graph path that turns it into graph tokens (paper III-C).

Public names: :class:`~qgmem_train.graph.local_graph.LocalGraph` and :func:`~qgmem_train.graph.local_graph.local_graph_from_units`
(the graph, and its torch_geometric form with ``graph_to_data``), :func:`~qgmem_train.graph.facts.graph_facts_text` (the
text path's ``[F#]`` facts), :class:`~qgmem_train.graph.encoder.RelationalGraphEncoder`, the readouts
(:func:`~qgmem_train.graph.readout.build_readout`), :class:`~qgmem_train.graph.projector.GraphTokenProjector`, and the
checks that a model reads its graphs (:mod:`~qgmem_train.graph.shuffle_gap`, :mod:`~qgmem_train.graph.diagnostics`).
"""
