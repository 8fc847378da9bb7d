-- The ledger distributed by tenant on Citus (ledger/distribution.py): what the catalog says is done, and each
-- step of distributing it. Asked only where the Citus extension is installed (jobs_distributed_citus).

-- name: distribution_tables_read
-- Each of the named tables in the ledger's schema: whether it exists, how Citus holds it ('distributed' by hash,
-- 'reference', another Citus kind, or NULL for a plain table), its colocation group, whether this role may
-- distribute it (owns it, or is a member of its owner) and which of the named triggers it still has.
SELECT t.name,
       c.oid IS NOT NULL AS present,
       CASE WHEN p.partmethod = 'h' THEN 'distributed'
            WHEN p.repmodel = 't' THEN 'reference'
            WHEN p.logicalrelid IS NOT NULL THEN 'other' END AS kind,
       p.colocationid AS colocation,
       c.oid IS NULL OR pg_has_role(c.relowner, 'USAGE') AS owned,
       ARRAY(SELECT g.tgname::text FROM pg_trigger g
             WHERE g.tgrelid = c.oid AND g.tgname = ANY(%(triggers)s::text[]) ORDER BY 1) AS triggers
FROM unnest(%(tables)s::text[]) WITH ORDINALITY AS t(name, ord)
LEFT JOIN pg_class c ON c.relname = t.name AND c.relnamespace = current_schema()::regnamespace
LEFT JOIN pg_dist_partition p ON p.logicalrelid = c.oid
ORDER BY t.ord;

-- name: distribution_claim_function_read
-- The claim for one tenant (migration 0023) in the ledger's schema: whether it exists, whether Citus
-- distributed it by an argument, whether this role may distribute it, and the role asking. A row in
-- pg_dist_object alone is not enough: Citus 12 propagates a function the distributed tables depend on by itself,
-- with no distribution argument, and a call of that one runs on the coordinator.
SELECT p.oid IS NOT NULL AS present,
       p.oid IS NOT NULL AND EXISTS (
           SELECT 1 FROM pg_dist_object o
           WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid AND o.distribution_argument_index IS NOT NULL
       ) AS distributed,
       p.oid IS NULL OR pg_has_role(p.proowner, 'USAGE') AS owned,
       current_user::text AS role
FROM (SELECT to_regprocedure(
    'effect_claim_tenant_v1(text, int[], text[], text[], text[], text[], text[], text[], text[], text[], int[],'
    ' int[], text[], text[], int[], int8[], text[], text[], timestamptz)'
) AS oid) f
LEFT JOIN pg_proc p ON p.oid = f.oid;

-- name: distribution_sequential_set_local
-- One connection per worker node for the rest of this transaction, as the hand-run distribute.sql of earlier
-- releases ran: create_distributed_function refuses a transaction that wrote to distributed tables over several
-- connections.
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

-- name: distribution_trigger_drop
-- Drops a fill trigger of migration 0022 ({trigger} and {table} are identifiers composed by ledger/distribution.py
-- from its own constants): Citus refuses to distribute a table with triggers.
DROP TRIGGER IF EXISTS {trigger} ON {table};

-- name: distribution_reference_table_create
-- Makes %(table)s (in the ledger's schema) a reference table: a copy on every node.
SELECT create_reference_table(%(table)s::regclass);

-- name: distribution_table_undistribute
-- Brings %(table)s (a reference table of an earlier release) back to the coordinator as a plain table.
SELECT undistribute_table(%(table)s::regclass);

-- name: distribution_fetch_index_create
-- The tenant-keyed index of pending jobs the per-tenant fetch and the fair discovery walk on Citus
-- (ledger/distribution.py, FETCH_INDEX): a tenant's fetch then reads its own rows only. The name is FETCH_INDEX's.
CREATE INDEX IF NOT EXISTS jobs_tenant_kind_due_idx ON jobs (tenant, kind, run_at, id) WHERE state = 'pending';

-- name: distribution_effects_create
-- Distributes effects by tenant in a colocation group of its own ('none'), which the ledger's other tables then
-- join: isolating a tenant of this ledger (isolate_tenant_to_new_shard) splits this ledger's shards only, never
-- those of another ledger on the cluster, as one group shared by every ledger did.
SELECT create_distributed_table('effects'::regclass, 'tenant', colocate_with => 'none');

-- name: distribution_table_create_with_effects
-- Distributes %(table)s by tenant colocated with this schema's effects, so every key and every join on
-- (id, tenant) stays within one tenant's shard group.
SELECT create_distributed_table(
    %(table)s::regclass, 'tenant', colocate_with => quote_ident(current_schema()) || '.effects'
);

-- name: distribution_claim_function_create_with_effects
-- Distributes the claim for one tenant by its tenant argument, colocated with this schema's effects: a call
-- outside a transaction block runs whole on the node holding that tenant's shards.
SELECT create_distributed_function(
    'effect_claim_tenant_v1(text, int[], text[], text[], text[], text[], text[], text[], text[], text[], int[],'
    ' int[], text[], text[], int[], int8[], text[], text[], timestamptz)'::regprocedure,
    '$1', colocate_with => quote_ident(current_schema()) || '.effects'
);

-- name: distribution_colocation_read
-- Where the ledger's distributed parts sit against effects' colocation group (no row while effects is not
-- distributed): whether a distributed table of another schema shares that group (a ledger distributed by the
-- distribute.sql of earlier releases sits in Citus's default group with every other ledger so distributed, and a
-- later create_distributed_table with the default colocation joins the oldest matching group, a 'none' one
-- too); which of this schema's hash-distributed tables (partitions each on their own) must join effects, every
-- one when the group is shared, else those in another group; the same for the claim function; and whether this
-- role owns effects and all of those, as update_distributed_table_colocation requires.
WITH e AS (
    SELECT p.colocationid,
           EXISTS (SELECT 1 FROM pg_dist_partition o JOIN pg_class c ON c.oid = o.logicalrelid
                   WHERE o.colocationid = p.colocationid
                     AND c.relnamespace <> current_schema()::regnamespace) AS shared,
           pg_has_role(k.relowner, 'USAGE') AS owned
    FROM pg_dist_partition p JOIN pg_class k ON k.oid = p.logicalrelid
    WHERE k.relname = 'effects' AND k.relnamespace = current_schema()::regnamespace AND p.partmethod = 'h'
), t AS (
    SELECT o.logicalrelid::regclass::text AS name, pg_has_role(c.relowner, 'USAGE') AS owned
    FROM e, pg_dist_partition o JOIN pg_class c ON c.oid = o.logicalrelid
    WHERE c.relnamespace = current_schema()::regnamespace AND c.relname <> 'effects' AND o.partmethod = 'h'
      AND (e.shared OR o.colocationid <> e.colocationid)
), f AS (
    SELECT pg_has_role(p.proowner, 'USAGE') AS owned
    FROM e, pg_dist_object o JOIN pg_proc p ON p.oid = o.objid
    WHERE o.classid = 'pg_proc'::regclass AND o.distribution_argument_index IS NOT NULL
      AND p.oid = to_regprocedure(
          'effect_claim_tenant_v1(text, int[], text[], text[], text[], text[], text[], text[], text[], text[],'
          ' int[], int[], text[], text[], int[], int8[], text[], text[], timestamptz)'
      )
      AND (e.shared OR o.colocationid IS DISTINCT FROM e.colocationid)
)
SELECT e.shared,
       ARRAY(SELECT t.name FROM t ORDER BY 1) AS tables,
       EXISTS (SELECT 1 FROM f) AS function,
       e.owned AND (SELECT coalesce(bool_and(t.owned), true) FROM t)
           AND (SELECT coalesce(bool_and(f.owned), true) FROM f) AS owned
FROM e;

-- name: distribution_effects_colocation_break
-- Moves effects into a colocation group of its own, leaving the group it shared to the tables still in it.
-- Metadata only (pg_dist_partition and pg_dist_colocation, synced to the nodes): no shard moves or is copied.
SELECT update_distributed_table_colocation('effects'::regclass, colocate_with => 'none');

-- name: distribution_table_colocation_join_effects
-- Puts %(table)s (hash-distributed, in this schema) in the colocation group of this schema's effects. Metadata
-- only: Citus checks that the two tables' shards have the same ranges on the same nodes, as tables that were
-- colocated before have, and refuses otherwise.
SELECT update_distributed_table_colocation(
    %(table)s::regclass, colocate_with => quote_ident(current_schema()) || '.effects'
);
