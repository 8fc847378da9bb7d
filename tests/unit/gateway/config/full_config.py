"""Configurations that make the parser read every key: the tests of the settings declaration, its JSON Schema and
``config show`` all start from them, so a table added to FULL is checked by each."""

from __future__ import annotations

# Every table the parser reads, with one entry of each named table (NAME0) and of [[operators]].
FULL = """
[gateway.penalty_box]
[database]
[worker]
[handlers]
[sources.NAME0]
scheme = "stripe"
secrets = ["S"]
tenant_from = "/account"
tenants = ["a"]
[downstream.NAME0]
base_url = "http://127.0.0.1:1"
api_key_env = "K"
[effects.NAME0]
source = "NAME0"
events = ["payment_intent.succeeded"]
key = "order:{/data/object/id}"
[effects.NAME0.forward]
url = "http://127.0.0.1:1/effects"
secret_env = "F"
[[operators]]
name = "x"
token_env = "T"
scopes = ["view"]
[dashboard]
[operator]
[metrics]
[tracing]
endpoint = "http://127.0.0.1:4318/v1/traces"
[maintenance.lease_rescuer]
[maintenance.pending_waker]
[maintenance.sweeps]
[maintenance.partitions]
[retention.sources.NAME0]
payloads_days = 1
tombstones_days = "forever"
"""
# The older [reconciler] spelling is read only without [maintenance].
LEGACY = '[reconciler]\ntick = 1\n[sources.NAME0]\nscheme = "stripe"\nsecrets = ["S"]\n'
ENV = {"S": "whsec_" + "x" * 32, "K": "k", "T": "t" * 20, "F": "whsec_" + "f" * 32}
