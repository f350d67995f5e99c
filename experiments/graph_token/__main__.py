"""``python -m experiments.graph_token``: the graph-token study (:mod:`experiments.graph_token.cli`)."""

from experiments.graph_token.cli import main

raise SystemExit(main())
