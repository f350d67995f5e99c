"""``python -m experiments.retrieval``: retrieval quality on LoCoMo by channel (:mod:`experiments.retrieval.channels`)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from experiments.retrieval.channels import main  # noqa: E402

raise SystemExit(main())
