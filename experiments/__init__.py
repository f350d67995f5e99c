"""The project's studies, apart from the library: one subpackage a study (``graph_token``, ``retrieval``, ``reranker``),
each run as ``python -m experiments.<study>`` and keeping its reports in ``<study>/results/`` with an ``INDEX.md``."""
