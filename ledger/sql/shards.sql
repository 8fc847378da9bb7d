-- name: shard_tenants_on_live_nodes
-- Tenant discovery on Citus that a lost worker node cannot fail (ledger/shards.py): %(command)s, one shard's read
-- (a *_on_shard block), runs on every shard of %(table)s, and each node answers for its own shards, so a node that
-- cannot be reached comes back as one row with its shards and error while the others' tenants still come back.
-- A multi-shard SELECT fails whole when one node is down; run_command_on_shards does not, but opens a connection
-- per shard (32 here: 250 ms a call on the cluster of ../shared/citus); master_run_on_worker, the function it calls,
-- takes one command per node, so this sends each node the union of its shards' reads over one connection (35-55 ms).
-- Each shard's read carries its own ORDER BY ... LIMIT, so the bound is in each shard's plan.
-- The command's values are literals that format() quotes, never text pasted in by Python: %1$s the shard of
-- %(table)s, %2$s the shard of %(joined)s in the same shard group (co-located, so same hash range), %3$L the
-- parameters as one jsonb, with "now" the coordinator's clock when %(now)s is NULL (one clock for every node).
-- How long a node that does not answer can hold the call: citus.node_connection_timeout, set for this transaction
-- in master_run_on_worker's last argument (an argument is evaluated before the call opens its connections).
WITH shard AS (
    SELECT s.shardid, n.nodename, n.nodeport,
           format(%(command)s, shard_name(s.logicalrelid, s.shardid), shard_name(j.logicalrelid, j.shardid),
                  (%(params)s::jsonb
                   || jsonb_build_object('now', coalesce(%(now)s::timestamptz, now())))::text) AS cmd
    FROM pg_dist_shard s
    JOIN pg_dist_shard j ON j.logicalrelid = %(joined)s::regclass AND j.shardminvalue = s.shardminvalue
    JOIN pg_dist_placement p ON p.shardid = s.shardid
    JOIN pg_dist_node n ON n.groupid = p.groupid
    WHERE s.logicalrelid = %(table)s::regclass
),
node AS (
    SELECT nodename, nodeport, array_agg(shardid ORDER BY shardid) AS shards,
           'SELECT coalesce(json_agg(u), ''[]'') FROM ('
           || string_agg('(' || cmd || ')', ' UNION ALL ' ORDER BY shardid) || ') u' AS cmd
    FROM shard GROUP BY nodename, nodeport
),
ran AS (
    SELECT r.node_name, r.node_port, r.success, r.result
    FROM (SELECT array_agg(nodename) AS names, array_agg(nodeport) AS ports, array_agg(cmd) AS cmds FROM node) a
    CROSS JOIN LATERAL master_run_on_worker(
        a.names, a.ports, a.cmds,
        set_config('citus.node_connection_timeout', %(timeout_ms)s::text, true) IS NOT NULL) r
)
SELECT t.tenant, NULL::text AS node, NULL::bigint[] AS shards, NULL::text AS error,
       min(t.at) AS first_at, min(t.id) AS first_id
FROM ran CROSS JOIN LATERAL json_to_recordset(ran.result::json) AS t(tenant text, at timestamptz, id bigint)
WHERE ran.success
GROUP BY t.tenant
UNION ALL
SELECT NULL, ran.node_name || ':' || ran.node_port, node.shards, ran.result, NULL, NULL
FROM ran JOIN node ON node.nodename = ran.node_name AND node.nodeport = ran.node_port
WHERE NOT ran.success
ORDER BY first_at, first_id, node;

