#!/bin/sh
# One-shot: create Temporal's two PostgreSQL databases and bring their schemas up to the
# version the pinned admin-tools image ships. Safe to re-run: `create` on an existing
# database fails harmlessly and update-schema only applies what is missing.
set -eu
: "${POSTGRES_SEEDS:?}" "${POSTGRES_USER:?}" "${SQL_PASSWORD:?}"
port="${DB_PORT:-5432}"
schema=/etc/temporal/schema/postgresql/v12
for db in temporal temporal_visibility; do
    case "$db" in
    temporal) dir="$schema/temporal/versioned" ;;
    *) dir="$schema/visibility/versioned" ;;
    esac
    sql="temporal-sql-tool --plugin postgres12 --ep $POSTGRES_SEEDS -u $POSTGRES_USER -p $port --db $db"
    $sql create || echo "database $db exists"
    $sql setup-schema -v 0.0
    $sql update-schema -d "$dir"
done
echo "schema ready"
