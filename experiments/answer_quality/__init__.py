"""The answer-quality study: the configured pipeline's judged answers on the four benchmark formats (LoCoMo, BEAM,
LongMemEval, FactConsolidation), side by side in one run; :mod:`experiments.answer_quality.cli` says how. Reports and
their index: ``results/INDEX.md``."""
