"""The ledger on a Citus cluster: what the database is (``topology``), distributing a ledger by tenant
(``distribution``, run by ``effectgate migrate``), and reading which tenants have work node by node so a lost
worker node stops only its own tenants (``shards``). On one Postgres only ``topology`` is asked, once per
process (ledger/handle.py)."""
