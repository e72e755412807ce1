#!/usr/bin/env bash
# The credentials step: makes the NATS operator, account and user (nsc), a CA and the server's
# certificate (openssl), the checkpoint key (openssl), and the four Secrets the manifests
# mount, in namespace goodput:
#   goodput-nats-server  nats.conf (this folder's), resolver.conf (operator + account JWTs)
#   goodput-nats-tls     tls.crt, tls.key, ca.crt
#   goodput-nats-creds   goodput.creds (the services' and ranks' user: JWT + nkey seed)
#   goodput-ckpt-key     key (signs checkpoint manifests, authenticates the peer data plane)
#
# Usage: deploy/k8s/nats/credentials.sh OUT_DIR [--dry-run]
#   OUT_DIR keeps the keys (operator, account and user seeds, CA key): keep it private; its
#   goodput.creds and ca.crt are also what `goodput status/report/chaos/run` use from outside.
#   --dry-run writes the Secrets to OUT_DIR/secrets.yaml instead of applying them.
# Environment: GOODPUT_NAMESPACE (goodput), GOODPUT_NATS_HOSTS (extra names/IPs the server
# certificate must carry, space-separated, e.g. a LoadBalancer's address).
# Needs nsc (https://github.com/nats-io/nsc), openssl and kubectl.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: credentials.sh OUT_DIR [--dry-run]}
dry_run=${2:-}
namespace=${GOODPUT_NAMESPACE:-goodput}
mkdir -p "$out"
chmod 700 "$out"
out=$(cd "$out" && pwd)

# ---- operator, account, user (nsc keeps its store and keys under OUT_DIR) ----
nsc=(nsc --config-dir "$out/nsc/config" --data-dir "$out/nsc/stores" --keystore-dir "$out/nsc/keys")
if [ ! -f "$out/goodput.creds" ]; then
  "${nsc[@]}" add operator --name goodput --sys --generate-signing-key
  "${nsc[@]}" edit operator --require-signing-keys
  "${nsc[@]}" add account --name GOODPUT
  "${nsc[@]}" edit account --name GOODPUT --sk generate \
    --js-mem-storage -1 --js-disk-storage -1 --js-streams -1 --js-consumer -1
  "${nsc[@]}" add user --account GOODPUT --name goodput
  "${nsc[@]}" generate creds --account GOODPUT --name goodput > "$out/goodput.creds"
fi
"${nsc[@]}" generate config --mem-resolver --sys-account SYS --config-file "$out/resolver.conf" --force

# ---- a CA and the servers' certificate, for the in-cluster names and GOODPUT_NATS_HOSTS ----
if [ ! -f "$out/tls.crt" ]; then
  sans="DNS:goodput-nats,DNS:goodput-nats.$namespace,DNS:goodput-nats.$namespace.svc"
  sans+=",DNS:goodput-nats.$namespace.svc.cluster.local,DNS:localhost,IP:127.0.0.1"
  # each server's own name, which the cluster routes dial (nats.conf)
  sans+=",DNS:*.goodput-nats-headless,DNS:*.goodput-nats-headless.$namespace.svc"
  for host in ${GOODPUT_NATS_HOSTS:-}; do
    if [[ $host =~ ^[0-9.]+$ ]]; then sans+=",IP:$host"; else sans+=",DNS:$host"; fi
  done
  ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)  # ECDSA P-256
  openssl req -x509 "${ec[@]}" -days 825 -subj "/CN=goodput-nats-ca" \
    -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
  openssl req "${ec[@]}" -subj "/CN=goodput-nats" \
    -keyout "$out/tls.key" -out "$out/tls.csr" 2>/dev/null
  # clientAuth too: a server presents it when it dials its peers' routes (mutual TLS)
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$sans" > "$out/tls.ext"
  openssl x509 -req -in "$out/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -CAcreateserial -days 825 -extfile "$out/tls.ext" -out "$out/tls.crt" 2>/dev/null
fi

# ---- the checkpoint key: 32 random bytes, hex (GOODPUT_CKPT_KEY_FILE of services and ranks) ----
if [ ! -f "$out/ckpt.key" ]; then
  (umask 077 && openssl rand -hex 32 > "$out/ckpt.key")
fi

# ---- the Secrets ----
secrets() {
  local create=(kubectl create secret generic --namespace "$namespace" --dry-run=client -o yaml)
  "${create[@]}" goodput-nats-server \
    --from-file=nats.conf="$here/nats.conf" --from-file=resolver.conf="$out/resolver.conf"
  echo "---"
  "${create[@]}" goodput-nats-tls --from-file=tls.crt="$out/tls.crt" \
    --from-file=tls.key="$out/tls.key" --from-file=ca.crt="$out/ca.crt"
  echo "---"
  "${create[@]}" goodput-nats-creds --from-file=goodput.creds="$out/goodput.creds"
  echo "---"
  "${create[@]}" goodput-ckpt-key --from-file=key="$out/ckpt.key"
}
if [ "$dry_run" = "--dry-run" ]; then
  secrets > "$out/secrets.yaml"
  echo "credentials: Secrets written to $out/secrets.yaml (not applied)" >&2
else
  secrets | kubectl apply -f -
  echo "credentials: Secrets applied in namespace $namespace; keys stay in $out" >&2
fi
