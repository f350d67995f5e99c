"""``python -m qgmem_train.eval TASK ...``: the same as ``python -m qgmem_train eval TASK ...``."""

import sys

from qgmem_train.__main__ import main

sys.exit(main(["eval", *sys.argv[1:]]))
