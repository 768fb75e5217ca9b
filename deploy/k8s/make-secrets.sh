#!/usr/bin/env bash
# Makes the files an overlay's Secrets are generated from.
#
# tls/ (Secret trainyard-tls): a CA, and one certificate and key it signed that the coordinator,
# every agent and the in-cluster clients share. The certificate names the coordinator's Service
# and, with a wildcard, every agent pod behind the headless Service trainyard-agents, so it
# serves both ends of mutual TLS.
# auth/ (Secret trainyard-auth): the coordinator's token file `tokens` (hashes only), the agents'
# token `agent.token` (role agent) and the demo client's `client.token` (user "demo").
#
# Usage: deploy/k8s/make-secrets.sh OVERLAY_DIR [NAMESPACE] [DAYS]
#   writes OVERLAY_DIR/tls/{ca.crt,tls.crt,tls.key} (NAMESPACE default trainyard, DAYS 365) and
#   OVERLAY_DIR/auth/{tokens,agent.token,client.token}; existing files are kept. The CA's key
#   stays in OVERLAY_DIR/tls/ca.key: keep it, or delete it once the certificate is made. Add
#   users with `trainyard-server token add NAME --tokens OVERLAY_DIR/auth/tokens` and apply the
#   overlay again. Never commit these files.
set -euo pipefail

[[ $# -ge 1 && $# -le 3 ]] || { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
dir="$1/tls"
auth="$1/auth"
ns=${2:-trainyard}
days=${3:-365}
[[ "$ns" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || { echo "make-secrets: bad namespace '$ns'" >&2; exit 2; }
[[ "$days" =~ ^[0-9]+$ ]] || { echo "make-secrets: DAYS must be a number" >&2; exit 2; }
umask 077

# A token, and its line in the token file (only the SHA-256 of the token is stored).
token_line() {  # USER ROLE TOKEN [OPTION]
  printf '%s %s sha256:%s%s\n' "$1" "$2" "$(printf %s "$3" | openssl dgst -sha256 -r | cut -d' ' -f1)" \
    "${4:+ $4}"
}
if [[ -f "$auth/tokens" && -f "$auth/agent.token" && -f "$auth/client.token" ]]; then
  echo "make-secrets: $auth already holds tokens, agent.token and client.token; kept" >&2
else
  mkdir -p "$auth"
  agent="ty_$(openssl rand -hex 32)"
  client="ty_$(openssl rand -hex 32)"
  printf '%s\n' "$agent" >"$auth/agent.token"
  printf '%s\n' "$client" >"$auth/client.token"
  {
    echo "# trainyard token file: USER ROLE CREDENTIAL [expires=TIME] [nodes=GLOB] (trainyard-server token)"
    # The agents register as their pods, trainyard-agent-0, -1, ... (StatefulSet trainyard-agent).
    token_line agents agent "$agent" 'nodes=trainyard-agent-*'
    token_line demo user "$client"
  } >"$auth/tokens"
  echo "make-secrets: wrote $auth/tokens, agent.token, client.token" >&2
fi

if [[ -f "$dir/tls.crt" && -f "$dir/tls.key" && -f "$dir/ca.crt" ]]; then
  echo "make-secrets: $dir already holds ca.crt, tls.crt and tls.key; kept" >&2
  exit 0
fi
mkdir -p "$dir"
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
echo "make-secrets: wrote $dir/ca.crt, tls.crt, tls.key (namespace $ns, $days days)" >&2
