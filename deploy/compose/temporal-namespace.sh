#!/bin/sh
# One-shot: register the namespace the workers use, run by the temporalio/admin-tools image
# (docker-compose.yml, service temporal-namespace). The `temporal` CLI reads TEMPORAL_ADDRESS and
# TEMPORAL_NAMESPACE from the environment. Idempotent.
set -eu

tries=0
until temporal operator cluster health; do
    tries=$((tries + 1))
    if [ "$tries" -ge 30 ]; then
        echo "Temporal server at $TEMPORAL_ADDRESS is not serving" >&2
        exit 1
    fi
    sleep 2
done

if temporal operator namespace describe --namespace "$TEMPORAL_NAMESPACE" > /dev/null 2>&1; then
    echo "namespace $TEMPORAL_NAMESPACE exists"
else
    temporal operator namespace create --namespace "$TEMPORAL_NAMESPACE" --retention "${NAMESPACE_RETENTION:-72h}"
    echo "namespace $TEMPORAL_NAMESPACE created"
fi
