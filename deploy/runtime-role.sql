-- The runtime role of docs/adr/0019-own-schema.md ("Roles"): what the gateway and the workers connect as.
-- It reads and writes effectgate's rows and calls its functions; it cannot create, alter or drop a table
-- (the owner, who runs `effectgate migrate`, keeps that). Run as the owner, after `effectgate migrate`:
--
--     EFFECTGATE_APP_PASSWORD=… psql "$OWNER_DATABASE_URL" -X -f deploy/runtime-role.sql
--
-- Compose runs it so after every migrate (its runtime-role service). Running it again is harmless, and it
-- is what a migration that adds a sequence or a function needs: the default privileges at the end cover
-- only a later migration's tables. The password comes from the environment (psql 15's \getenv), never
-- from the command line, and is set on every run: change it in the environment, run this again, and the
-- role has the new one. Creating the role needs CREATEROLE (compose's owner is the server's superuser);
-- where the owner lacks it, have an administrator `CREATE ROLE effectgate_app LOGIN` first.
\set ON_ERROR_STOP on
\getenv app_password EFFECTGATE_APP_PASSWORD
\if :{?app_password}
SELECT :'app_password' = '' AS no_password \gset
\else
\set no_password true
\endif
\if :no_password
DO $$ BEGIN RAISE EXCEPTION 'runtime-role.sql: set EFFECTGATE_APP_PASSWORD to the runtime role''s password'; END $$;
\endif
SELECT 'CREATE ROLE effectgate_app LOGIN'
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'effectgate_app') \gexec
ALTER ROLE effectgate_app LOGIN PASSWORD :'app_password';
-- The grants of the ADR, line for line (tests/unit/deploy/test_deploy.py keeps them equal), the owner being
-- whoever runs this.
GRANT USAGE ON SCHEMA effectgate TO effectgate_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA effectgate TO effectgate_app;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA effectgate TO effectgate_app;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA effectgate TO effectgate_app;
ALTER DEFAULT PRIVILEGES FOR ROLE CURRENT_USER IN SCHEMA effectgate
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO effectgate_app;
