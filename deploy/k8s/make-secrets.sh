#!/usr/bin/env bash
# Makes the TLS material an overlay's Secret is generated from: a CA, and one certificate and
# key it signed that the coordinator, every agent and the in-cluster clients share. The
# certificate names the coordinator's Service and, with a wildcard, every agent pod behind the
# headless Service trainyard-agents, so it serves both ends of mutual TLS.
#
# Usage: deploy/k8s/make-tls.sh OVERLAY_DIR [NAMESPACE] [DAYS]
#   writes OVERLAY_DIR/tls/{ca.crt,tls.crt,tls.key} (NAMESPACE default trainyard, DAYS 365);
#   existing files are kept. The CA's key stays in OVERLAY_DIR/tls/ca.key: keep it, or delete
#   it once the certificate is made. Never commit these files.
set -euo pipefail

[[ $# -ge 1 && $# -le 3 ]] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
dir="$1/tls"
ns=${2:-trainyard}
days=${3:-365}
[[ "$ns" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || { echo "make-tls: bad namespace '$ns'" >&2; exit 2; }
[[ "$days" =~ ^[0-9]+$ ]] || { echo "make-tls: DAYS must be a number" >&2; exit 2; }
if [[ -f "$dir/tls.crt" && -f "$dir/tls.key" && -f "$dir/ca.crt" ]]; then
  echo "make-tls: $dir already holds ca.crt, tls.crt and tls.key; kept" >&2
  exit 0
fi
mkdir -p "$dir"
umask 077
openssl req -x509 -newkey rsa:3072 -nodes -days "$days" -subj "/CN=trainyard CA ($ns)" \
  -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
openssl req -newkey rsa:3072 -nodes -subj "/CN=trainyard.$ns" \
  -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
cat >"$dir/tls.ext" <<EXT
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:trainyard-coordinator.$ns.svc,DNS:trainyard-coordinator.$ns.svc.cluster.local,DNS:*.trainyard-agents.$ns.svc,DNS:*.trainyard-agents.$ns.svc.cluster.local,DNS:localhost,IP:127.0.0.1
EXT
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
  -days "$days" -extfile "$dir/tls.ext" -out "$dir/tls.crt" 2>/dev/null
rm -f "$dir/tls.csr" "$dir/tls.ext" "$dir/ca.srl"
chmod 0644 "$dir/ca.crt" "$dir/tls.crt"
echo "make-tls: wrote $dir/ca.crt, tls.crt, tls.key (namespace $ns, $days days)" >&2
