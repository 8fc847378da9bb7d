"""Test and demo doubles that run as real servers: the fake payment and shipping providers.

They live in the gateway (the HTTP face), not in ``handlers``, which knows nothing of HTTP servers.
"""
