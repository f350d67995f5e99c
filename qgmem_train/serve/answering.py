"""What ``serve`` takes of the search-then-answer sequence: the one module whose imports name where it lives.

:func:`ask_batch` answers asks of one predictor in one generate call; :func:`ask_record` is the object
``ask --json`` prints. The service and the endpoints import them from here only, so moving the sequence
changes these lines and nothing else of ``serve``.
"""

from __future__ import annotations

from qgmem_train.ask import ask_record
from qgmem_train.predictor import ask_batch

__all__ = ["ask_batch", "ask_record"]
