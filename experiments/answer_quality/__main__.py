"""``python -m experiments.answer_quality``: answer quality on the four benchmark formats (:mod:`experiments.answer_quality.cli`)."""

from experiments.answer_quality.cli import main

raise SystemExit(main())
