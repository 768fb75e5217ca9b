#!/usr/bin/env bash
# KubeManifestsTest: every overlay of deploy/k8s renders with `kubectl kustomize`, and every
# rendered object validates offline against the Kubernetes OpenAPI schema of its kind
# (tests/deploy/kube/validate.js, with the npm package kubernetes-models that tools/setup.sh
# installs) and against the cross-object checks there. Broken copies must be refused, so the
# check itself is shown to fail. No cluster is needed. Skips (77) without kubectl, node or the
# npm packages.
#
# Usage: kube_test.sh SOURCE_DIR
set -uo pipefail

SRC=$1
KUBE="$SRC/tests/deploy/kube"
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*" >&2; exit 1; }

command -v kubectl >/dev/null || skip "kubectl is not installed (tools/setup.sh installs kubernetes-client)"
command -v node >/dev/null || skip "node is not installed (tools/setup.sh installs nodejs)"
[[ -d "$KUBE/node_modules/kubernetes-models" ]] ||
  skip "the npm packages are not installed (tools/setup.sh runs npm ci in tests/deploy/kube)"

T=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-kube.XXXXXX")
trap 'rm -rf "$T"' EXIT
# A copy, so that the TLS material the overlays need is made outside the source tree.
cp -r "$SRC/deploy/k8s" "$T/k8s"
overlays=()
for dir in "$T"/k8s/overlays/*/; do overlays+=("$(basename "$dir")"); done
[[ ${#overlays[@]} -ge 2 ]] || fail "expected the cpu-demo and gpu overlays, found: ${overlays[*]}"

for overlay in "${overlays[@]}"; do
  "$T/k8s/make-secrets.sh" "$T/k8s/overlays/$overlay" >/dev/null 2>&1 || fail "make-secrets.sh for $overlay"
  openssl verify -CAfile "$T/k8s/overlays/$overlay/tls/ca.crt" \
    "$T/k8s/overlays/$overlay/tls/tls.crt" >/dev/null || fail "$overlay: the certificate does not verify"
  kubectl kustomize "$T/k8s/overlays/$overlay" >"$T/$overlay.yaml" 2>"$T/$overlay.err" ||
    fail "kubectl kustomize $overlay: $(cat "$T/$overlay.err")"
  out=$(node "$KUBE/validate.js" "$T/$overlay.yaml") || fail "$overlay:"$'\n'"$out"
  echo "ok: $overlay: $out"
done

# The checks must catch what they are for.
broken() {  # NAME SED-EXPRESSION: the cpu-demo rendering, changed, must be refused
  sed "$2" "$T/cpu-demo.yaml" >"$T/broken-$1.yaml"
  cmp -s "$T/cpu-demo.yaml" "$T/broken-$1.yaml" && fail "the change '$1' changed nothing"
  if node "$KUBE/validate.js" "$T/broken-$1.yaml" >"$T/broken-$1.out"; then
    fail "a manifest with $1 passed"
  fi
  echo "ok: refused $1: $(head -n 1 "$T/broken-$1.out")"
}
broken "a port that is not a number" 's/containerPort: 7000/containerPort: seven/'
broken "replicas that are not a number" '0,/replicas: 1/s//replicas: one/'
broken "a Secret that does not exist" 's/secretName: trainyard-tls.*/secretName: missing/'
broken "a Secret key that does not exist" 's/key: agent.token/key: agent.tokn/'
broken "a Service that selects nothing" '/^kind: Service/,/^---/s/component: coordinator/component: coordinatr/'
broken "an unknown environment variable" 's/\$(POD_NAME)/$(POD_NAMEX)/'
echo "ok: every overlay renders and validates"
