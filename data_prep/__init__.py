"""Training data from the frozen pipeline (``python -m data_prep``, paper appendix B): ConvoMem cases built, searched,
answered and judged through :mod:`qgmem_train.pipeline`, one resumable shard at a time, then merged into trajectories.

Modules: :mod:`~data_prep.run` (a shard), :mod:`~data_prep.pipeline` (one case), :mod:`~data_prep.merge` (the
trajectory folder), :mod:`~data_prep.align` (alignment data: graphs and their own facts), :mod:`~data_prep.config`,
:mod:`~data_prep.convomem`, :mod:`~data_prep.sampling`, :mod:`~data_prep.targets`, :mod:`~data_prep.push`.
"""
