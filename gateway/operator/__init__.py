"""The operators' face: the HTTP API under ``/api/``, its bearer-token auth and OpenAPI document,
``/metrics``, and the dashboard under ``/ui/``. Everything here reads the ledger through
``ledger.reports`` and acts on jobs through ``ledger.jobs``; the CLI (``gateway/operator/cli/``)
reads the same reports and prints the same JSON documents.

This package's ``__init__`` imports nothing: ``gateway.config`` imports ``gateway.operator.auth`` while
it loads, and the routes import the config in turn.
"""
