#!/bin/sh
# One-shot schema set-up for Temporal on PostgreSQL, run by the temporalio/admin-tools image
# (docker-compose.yml, service temporal-schema). Connection settings come from the environment,
# as temporal-sql-tool reads them: SQL_PLUGIN, SQL_HOST, SQL_PORT, SQL_USER, SQL_PASSWORD.
#
# Idempotent: `create` fails harmlessly when the database already exists (a later step fails loudly
# if it really is missing), `setup-schema -v 0.0` keeps a newer version, and `update-schema` applies
# only the versions not yet applied. Re-run it after upgrading the server image.
set -eu

SCHEMA_ROOT=/etc/temporal/schema/postgresql/v12

until nc -z "$SQL_HOST" "$SQL_PORT"; do
    echo "waiting for PostgreSQL at $SQL_HOST:$SQL_PORT"
    sleep 1
done

for pair in "temporal:temporal" "temporal_visibility:visibility"; do
    db=${pair%%:*}
    dir=${pair##*:}
    echo "database $db"
    temporal-sql-tool --db "$db" create-database || echo "  $db exists already (or could not be created; checked next)"
    temporal-sql-tool --db "$db" setup-schema -v 0.0
    temporal-sql-tool --db "$db" update-schema -d "$SCHEMA_ROOT/$dir/versioned"
done
echo "Temporal schemas are up to date"
