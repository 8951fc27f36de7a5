#!/usr/bin/env bash
# Make a throw-away PKI for the Compose stack (and the TLS tests): a test CA, the
# Temporal frontend's server certificate, and one client certificate per client.
#
#   deploy/compose/make-test-ca.sh [OUT_DIR] [EXTRA_SAN ...]
#
# OUT_DIR defaults to deploy/compose/certs (git-ignored). EXTRA_SAN entries are added to
# the server certificate, e.g. DNS:temporal.example.com or IP:10.0.0.5; the server
# certificate always names DNS:temporal (the Compose service), DNS:localhost and
# IP:127.0.0.1, so the stack works both inside its network and from the host.
#
# Layout (what each container mounts, and nothing else):
#   ca/ca.key                  the CA's signing key, mode 0600: never mounted anywhere
#   ca.pem                     the CA certificate every party trusts
#   server.pem, server.key     the Temporal frontend and internode certificate
#   worker.pem, worker.key     the Lazarus worker's client certificate (CN=lazarus-worker)
#   ui.pem, ui.key             the Web UI's client certificate
#   admin.pem, admin.key       the admin CLI's client certificate (namespace setup)
#
# Leaf keys are 0644 because each image runs as its own user id (temporal, the UI's,
# lazarus 10001); isolation comes from each container mounting only its own key. This is
# a TEST CA: for production use your own PKI (cert-manager, Vault, ...), with keys
# readable by their one service user only.
#
# Idempotent in the sense that it refuses to overwrite: delete OUT_DIR to start over.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-${here}/certs}"
shift || true
days="${LAZARUS_TEST_CA_DAYS:-30}"

command -v openssl >/dev/null 2>&1 || {
    echo "make-test-ca.sh: openssl not found (apt-get install openssl)" >&2
    exit 1
}
if [[ -e "${out}/ca.pem" ]]; then
    echo "make-test-ca.sh: ${out}/ca.pem exists; remove ${out} to make a new CA" >&2
    exit 1
fi
mkdir -p "${out}/ca"
chmod 0700 "${out}/ca"

san="DNS:temporal,DNS:localhost,IP:127.0.0.1"
for extra in "$@"; do
    case "${extra}" in
    DNS:* | IP:*) san="${san},${extra}" ;;
    *)
        echo "make-test-ca.sh: extra SAN '${extra}' must start with DNS: or IP:" >&2
        exit 1
        ;;
    esac
done

# ECDSA P-256: small, fast to make, and accepted by Go (Temporal), rustls (the Python
# SDK's core) and OpenSSL (the UI's Node runtime) alike.
new_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

new_key "${out}/ca/ca.key"
chmod 0600 "${out}/ca/ca.key"
openssl req -x509 -new -key "${out}/ca/ca.key" -sha256 -days "${days}" \
    -subj "/O=Lazarus test CA/CN=Lazarus test CA" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "${out}/ca.pem"

# sign NAME CN EXTENDED_KEY_USAGE [SAN]
sign() {
    local name="$1" cn="$2" eku="$3" alt="${4:-}"
    local ext
    ext="$(mktemp)"
    {
        echo "basicConstraints=critical,CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        echo "extendedKeyUsage=${eku}"
        [[ -n "${alt}" ]] && echo "subjectAltName=${alt}"
    } >"${ext}"
    new_key "${out}/${name}.key"
    openssl req -new -key "${out}/${name}.key" -subj "/O=Lazarus test/CN=${cn}" \
        -out "${out}/${name}.csr"
    openssl x509 -req -in "${out}/${name}.csr" -CA "${out}/ca.pem" -CAkey "${out}/ca/ca.key" \
        -CAcreateserial -CAserial "${out}/ca/ca.srl" -sha256 -days "${days}" \
        -extfile "${ext}" -out "${out}/${name}.pem" 2>/dev/null
    rm -f "${ext}" "${out}/${name}.csr"
    chmod 0644 "${out}/${name}.key" "${out}/${name}.pem"
}

# The server certificate is also the client certificate Temporal's own services present
# to each other (internode mTLS), so it carries both usages.
sign server temporal "serverAuth,clientAuth" "${san}"
sign worker lazarus-worker clientAuth
sign ui temporal-ui clientAuth
sign admin temporal-admin clientAuth
chmod 0644 "${out}/ca.pem"

echo "make-test-ca.sh: test PKI in ${out} (server SANs: ${san}; valid ${days} days)"
