"""Performance benchmarks: scripts that time things (``python bench/<script>.py``, all of them with ``bench/run_all.py``),
the GPU check, and the machine record both they and the studies write beside their figures (:mod:`qgmem_train.reports`)."""
