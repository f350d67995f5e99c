"""Training the graph path (paper III-C, III-D): the LightningModule, its data and what a fit on a cluster needs.

Public names: :class:`~qgmem_train.model.module.GraphAugmentedLM` (a frozen LLM, a trainable graph encoder, readout and
projector), its settings in groups (:mod:`~qgmem_train.model.settings`), :class:`~qgmem_train.model.datamodule.TrajectoryDataModule`,
adapter checkpoints (:mod:`~qgmem_train.model.checkpoint`), and the launch checks, Slurm requeue and prefix cache of a fit.
"""
