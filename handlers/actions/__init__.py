"""Operator actions outside a worker: bulk redrive and cancel, pause and resume, replay."""
