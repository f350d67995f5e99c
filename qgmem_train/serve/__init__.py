"""``python -m qgmem_train serve``: the predictor's memory behind an HTTP API (FastAPI on uvicorn) for many tenants.

Modules: :mod:`~qgmem_train.serve.tenants` (bearer tokens and the namespaces each may touch),
:mod:`~qgmem_train.serve.limits` (request bounds and per-tenant rates), :mod:`~qgmem_train.serve.service`
(the model and store behind the endpoints, off the event loop, asks batched), :mod:`~qgmem_train.serve.schemas`
(request and response bodies), :mod:`~qgmem_train.serve.app` (the endpoints), :mod:`~qgmem_train.serve.cli`
(the command).
"""
