#!/usr/bin/env bash
# Runs one Website controller against the cluster of $KUBECONFIG and checks
# what it does, step by step: the same checks for kinformer's example and
# its kube-runtime and controller-runtime peers (docs/controllers.md).
#
#   bash examples/website/check.sh PROGRAM [ARGS...]
#
# PROGRAM is started with LEASE_NAMESPACE (the namespace of its Lease,
# "website-controller"), METRICS_ADDR and PROBE_ADDR (where it serves
# /metrics and /healthz, /readyz) in its environment. It must:
# - hold the Lease website-controller in LEASE_NAMESPACE while it runs;
# - for each Website, add the finalizer example.kinformer.dev/cleanup;
#   server-side apply (field manager "website-controller") a Deployment and
#   a Service named after it, each with a controller ownerReference to it:
#   the Deployment with labels and selector app=NAME, spec.replicas, one
#   container "web" of spec.image with port 80 and env WEBSITE_HOST=spec.host;
#   the Service selecting app=NAME on port 80; then write
#   status.readyReplicas (the Deployment's, 0 when unset) through the status
#   subresource;
# - reconcile a Website again when its Deployment or Service changes;
# - on a failed reconcile, record a Warning Event about the Website;
# - on deletion, print a line with "cleanup" and the Website's name, then
#   remove the finalizer;
# - exit 0 on SIGTERM.
# Needs kubectl and curl. Exits non-zero at the first failed check.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 PROGRAM [ARGS...]" >&2; exit 2; }
: "${KUBECONFIG:?set KUBECONFIG to the cluster to check against}"

ns="website-check-$$-$RANDOM"
metrics_port=$((20000 + RANDOM % 20000))
probe_port=$((metrics_port + 1))
log="$(mktemp -t website-check.XXXXXX.log)"
pid=""

cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
}
trap cleanup EXIT

step() { printf '%-60s' "$1"; }
ok() { echo "ok${1:+ ($1)}"; }
fail() { echo "FAILED: $1"; echo "--- controller log ($log):"; tail -n 40 "$log"; exit 1; }

# until SECONDS CMD...: runs CMD every 0.2 s until it succeeds.
until_ok() {
    local deadline=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 0.2
    done
}
jp() { kubectl -n "$ns" get "$1" -o "jsonpath=$2" 2>/dev/null; }
is() { [ "$(jp "$1" "$2")" = "$3" ]; }
has() { jp "$1" "$2" | grep -q -- "$3"; }

step "CRD installed and established"
kubectl apply -f "$here/crd.yaml" >/dev/null
kubectl wait --for=condition=Established crd/websites.example.kinformer.dev --timeout=60s >/dev/null || fail "CRD"
kubectl create namespace "$ns" >/dev/null
ok

step "controller started, ready"
started=$SECONDS
LEASE_NAMESPACE="$ns" METRICS_ADDR="127.0.0.1:$metrics_port" PROBE_ADDR="127.0.0.1:$probe_port" \
    "$@" >"$log" 2>&1 &
pid=$!
until_ok 60 curl -fsS "http://127.0.0.1:$probe_port/readyz" || fail "/readyz never answered 200"
curl -fsS "http://127.0.0.1:$probe_port/healthz" >/dev/null || fail "/healthz"
ok "$((SECONDS - started)) s"

step "it holds the Lease website-controller"
until_ok 30 bash -c "[ -n \"\$(kubectl -n $ns get lease website-controller -o jsonpath='{.spec.holderIdentity}')\" ]" \
    || fail "no holder on Lease $ns/website-controller"
ok "$(jp lease/website-controller '{.spec.holderIdentity}')"

step "a Website gets its finalizer, Deployment and Service"
kubectl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: example.kinformer.dev/v1
kind: Website
metadata: {name: shop}
spec: {image: "nginx:1.27", replicas: 2, host: shop.example.com}
EOF
until_ok 30 has website/shop '{.metadata.finalizers}' 'example.kinformer.dev/cleanup' || fail "finalizer"
until_ok 30 is deployment/shop '{.spec.replicas}' 2 || fail "Deployment shop with 2 replicas"
until_ok 30 is service/shop '{.spec.selector.app}' shop || fail "Service shop selecting app=shop"
is deployment/shop '{.spec.template.spec.containers[0].name}' web || fail "container name"
is deployment/shop '{.spec.template.spec.containers[0].image}' nginx:1.27 || fail "image"
is deployment/shop '{.spec.template.spec.containers[0].ports[0].containerPort}' 80 || fail "container port"
is deployment/shop '{.spec.template.spec.containers[0].env[?(@.name=="WEBSITE_HOST")].value}' shop.example.com \
    || fail "WEBSITE_HOST"
is deployment/shop '{.spec.selector.matchLabels.app}' shop || fail "Deployment selector"
is deployment/shop '{.spec.template.metadata.labels.app}' shop || fail "pod labels"
is service/shop '{.spec.ports[0].port}' 80 || fail "Service port"
uid="$(jp website/shop '{.metadata.uid}')"
for kind in deployment service; do
    is "$kind/shop" '{.metadata.ownerReferences[0].uid}' "$uid" || fail "$kind owner"
    is "$kind/shop" '{.metadata.ownerReferences[0].controller}' true || fail "$kind controller owner"
    has "$kind/shop" '{.metadata.managedFields[?(@.operation=="Apply")].manager}' website-controller \
        || fail "$kind applied by website-controller"
done
ok

step "status.readyReplicas follows the Deployment"
until_ok 30 is website/shop '{.status.readyReplicas}' 0 || fail "status.readyReplicas 0"
kubectl -n "$ns" patch deployment shop --subresource=status --type=merge \
    -p '{"status":{"replicas":2,"readyReplicas":2}}' >/dev/null
until_ok 30 is website/shop '{.status.readyReplicas}' 2 || fail "status.readyReplicas 2"
ok

step "a deleted Service is created again"
kubectl -n "$ns" delete service shop --wait=true >/dev/null
until_ok 30 is service/shop '{.spec.selector.app}' shop || fail "Service not recreated"
ok

step "a spec change reaches the Deployment"
kubectl -n "$ns" patch website shop --type=merge -p '{"spec":{"replicas":3}}' >/dev/null
until_ok 30 is deployment/shop '{.spec.replicas}' 3 || fail "replicas 3"
ok

step "a failing reconcile records a Warning Event"
kubectl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: example.kinformer.dev/v1
kind: Website
metadata: {name: broken}
spec: {image: "nginx:1.27", replicas: -1, host: broken.example.com}
EOF
until_ok 60 bash -c "kubectl -n $ns get events --field-selector type=Warning,involvedObject.name=broken,involvedObject.kind=Website -o name | grep -q ." \
    || fail "no Warning Event about Website broken"
ok "$(kubectl -n "$ns" get events --field-selector type=Warning,involvedObject.name=broken -o jsonpath='{.items[0].reason}')"

step "metrics served"
metrics="$(curl -fsS "http://127.0.0.1:$metrics_port/metrics")" || fail "/metrics did not answer"
grep -qi reconcile <<<"$metrics" || fail "/metrics without reconcile metrics"
ok

step "a deleted Website is cleaned up and goes"
kubectl -n "$ns" delete website shop --wait=false >/dev/null
until_ok 30 bash -c "! kubectl -n $ns get website shop -o name" || fail "Website shop still there (finalizer kept)"
grep -i cleanup "$log" | grep -q shop || fail "no cleanup line naming shop"
ok

step "SIGTERM: exits 0"
kill -TERM "$pid"
code=0
wait "$pid" || code=$?
pid=""
[ "$code" = 0 ] || fail "exit code $code"
ok
echo "PASS"
