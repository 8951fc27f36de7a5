#!/bin/sh
# One-shot: wait for the frontend (over mTLS, with the admin client certificate), then
# create the namespace Lazarus uses if it is not there yet.
set -eu
ns="${NAMESPACE:-default}"
tls="--tls-ca-path /certs/ca.pem --tls-cert-path /certs/admin.pem --tls-key-path /certs/admin.key --tls-server-name temporal"
tries=0
until temporal operator cluster health --address "$TEMPORAL_ADDRESS" $tls; do
    tries=$((tries + 1))
    [ "$tries" -lt 60 ] || { echo "frontend not healthy after 60 tries" >&2; exit 1; }
    sleep 2
done
if temporal operator namespace describe --namespace "$ns" --address "$TEMPORAL_ADDRESS" $tls >/dev/null 2>&1; then
    echo "namespace $ns exists"
else
    temporal operator namespace create --namespace "$ns" --retention 7d --address "$TEMPORAL_ADDRESS" $tls
fi
