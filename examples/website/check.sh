#!/usr/bin/env bash
# Runs one Website controller against the cluster of $KUBECONFIG and checks
# what it does, step by step: the same checks for kinformer's example and
# its kube-runtime and controller-runtime peers (docs/controllers.md). The
# program's webhooks listen on 127.0.0.1, so the API server must run on
# this machine (`cargo xtask envtest up`, or a local control plane).
#
#   bash examples/website/check.sh PROGRAM [ARGS...]
#
# PROGRAM is started with LEASE_NAMESPACE (the namespace of its Lease,
# "website-controller"), METRICS_ADDR and PROBE_ADDR (where it serves
# /metrics and /healthz, /readyz), WEBHOOK_ADDR and CERT_DIR (where it
# serves its webhooks over HTTPS, with tls.crt and tls.key from CERT_DIR) in
# its environment. It must:
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
# - serve, at kubebuilder's paths for the kind, a defaulting webhook that
#   sets an empty spec.host to NAME.example.com, a validating one that
#   refuses spec.replicas outside 0 to 10 with the message "spec.replicas
#   must be 0 to 10, not N" and warns of an image without a tag ("... has
#   no tag ..."), and at /convert the conversion between v1 and v2
#   (v2: spec.host, spec.pods.image, spec.pods.replicas);
# - exit 0 on SIGTERM.
# The webhook configurations this script installs call the program only for
# Websites in its own namespace, and are removed when it ends.
# With NAMESPACE set, the checks run in that namespace (it must exist, and
# is deleted at the end); with PROGRAM_KUBECONFIG set, PROGRAM runs with
# that kubeconfig (a ServiceAccount bound to the rules it needs, say) while
# the checks use KUBECONFIG.
# Needs kubectl, curl and openssl. Exits non-zero at the first failed check.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 PROGRAM [ARGS...]" >&2; exit 2; }
: "${KUBECONFIG:?set KUBECONFIG to the cluster to check against}"

ns="${NAMESPACE:-website-check-$$-$RANDOM}"
# Below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range,
# 32768 and up by default), where the local end of an outgoing connection, or a
# test server bound to port 0, may already hold the port: the program would fail
# to bind and /readyz would never answer.
metrics_port=$((20000 + RANDOM % 12000))
probe_port=$((metrics_port + 1))
webhook_port=$((metrics_port + 2))
log="$(mktemp -t website-check.XXXXXX.log)"
# kubectl reads and patches a kind in its highest version, v2; the checks name v1.
v1=websites.v1.example.kinformer.dev
certs="$(mktemp -d -t website-check-certs.XXXXXX)"
pid=""

cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    [ -n "${KEEP:-}" ] && return
    kubectl delete mutatingwebhookconfiguration,validatingwebhookconfiguration "$ns" \
        --wait=false >/dev/null 2>&1 || true
    # The CRD's conversion back to crd.yaml's (not this program's URL, gone
    # now: every read in v2, kubectl's default, would fail), and the
    # Websites' finalizers off (no controller runs to remove them).
    for w in $(kubectl -n "$ns" get "$v1" -o 'jsonpath={.items[*].metadata.name}' 2>/dev/null); do
        kubectl -n "$ns" patch "$v1" "$w" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
    done
    kubectl apply -f "$here/crd.yaml" >/dev/null 2>&1 || true
    kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
    rm -rf "$certs"
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

step "a CA and a serving certificate for 127.0.0.1"
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=website-check-ca" \
    -keyout "$certs/ca.key" -out "$certs/ca.crt" >/dev/null 2>&1 || fail "CA"
openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$certs/tls.key" -out "$certs/tls.csr" >/dev/null 2>&1 || fail "CSR"
openssl x509 -req -in "$certs/tls.csr" -CA "$certs/ca.crt" -CAkey "$certs/ca.key" -CAcreateserial \
    -days 1 -extfile <(printf 'subjectAltName=IP:127.0.0.1\n') -out "$certs/tls.crt" >/dev/null 2>&1 \
    || fail "serving certificate"
ca_bundle="$(base64 -w0 <"$certs/ca.crt")"
url="https://127.0.0.1:$webhook_port"
ok

step "CRD installed, its conversion pointed at the program"
# crd.yaml's clientConfig names a Service; here the webhook is on loopback.
crd="$(sed "s|{service: {namespace: website-system, name: website-webhook, path: /convert}}|{url: \"$url/convert\", caBundle: \"$ca_bundle\"}|" \
    "$here/crd.yaml")"
grep -q "$url/convert" <<<"$crd" || fail "crd.yaml's conversion clientConfig not found"
kubectl apply -f - <<<"$crd" >/dev/null || fail "CRD"
kubectl wait --for=condition=Established crd/websites.example.kinformer.dev --timeout=60s >/dev/null || fail "CRD"
[ -n "${NAMESPACE:-}" ] || kubectl create namespace "$ns" >/dev/null
ok

step "controller started, ready"
started=$SECONDS
KUBECONFIG="${PROGRAM_KUBECONFIG:-$KUBECONFIG}" LEASE_NAMESPACE="$ns" \
    METRICS_ADDR="127.0.0.1:$metrics_port" PROBE_ADDR="127.0.0.1:$probe_port" \
    WEBHOOK_ADDR="127.0.0.1:$webhook_port" CERT_DIR="$certs" RUST_LIB_BACKTRACE=0 \
    "$@" >"$log" 2>&1 &
pid=$!
until_ok 60 curl -fsS "http://127.0.0.1:$probe_port/readyz" || fail "/readyz never answered 200"
curl -fsS "http://127.0.0.1:$probe_port/healthz" >/dev/null || fail "/healthz"
ok "$((SECONDS - started)) s"

step "it holds the Lease website-controller"
until_ok 30 bash -c "[ -n \"\$(kubectl -n $ns get lease website-controller -o jsonpath='{.spec.holderIdentity}')\" ]" \
    || fail "no holder on Lease $ns/website-controller"
ok "$(jp lease/website-controller '{.spec.holderIdentity}')"

# website NAME REPLICAS [IMAGE [VERSION]]: a Website's manifest (v1 with no host).
website() {
    if [ "${4:-v1}" = v2 ]; then
        printf 'apiVersion: example.kinformer.dev/v2\nkind: Website\nmetadata: {name: %s}\n' "$1"
        printf 'spec: {host: %s.example.org, pods: {image: "%s", replicas: %s}}\n' "$1" "${3:-nginx:1.27}" "$2"
    else
        printf 'apiVersion: example.kinformer.dev/v1\nkind: Website\nmetadata: {name: %s}\n' "$1"
        printf 'spec: {image: "%s", replicas: %s}\n' "${3:-nginx:1.27}" "$2"
    fi
}
# dry_run ARGS...: a server-side dry run of `kubectl apply ARGS` of stdin (webhooks are called).
dry_run() { kubectl -n "$ns" apply --dry-run=server -f - "$@" 2>&1; }

step "webhooks installed, pointing at it"
for kind in Mutating Validating; do
    path="$( [ $kind = Mutating ] && echo mutate || echo validate )-example-kinformer-dev-v1-website"
    kubectl apply -f - >/dev/null <<EOF || fail "${kind}WebhookConfiguration"
apiVersion: admissionregistration.k8s.io/v1
kind: ${kind}WebhookConfiguration
metadata: {name: $ns}
webhooks:
  - name: ${path%%-*}.website.$ns.kinformer.dev
    clientConfig: {url: "$url/$path", caBundle: "$ca_bundle"}
    rules:
      - {apiGroups: [example.kinformer.dev], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [websites]}
    namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: $ns}}
    failurePolicy: Fail
    sideEffects: None
    admissionReviewVersions: [v1]
EOF
done
# The API server loads configurations from a watch: wait until both are in use.
defaulting() { [ "$(website probe 1 | dry_run -o jsonpath='{.spec.host}')" = probe.example.com ]; }
validating() { grep -q 'spec.replicas must be 0 to 10, not 11' <<<"$(website probe 11 | dry_run)"; }
until_ok 30 defaulting || fail "the defaulting webhook is never called"
until_ok 30 validating || fail "the validating webhook is never called"
ok

step "a Website gets its finalizer, Deployment and Service"
website shop 2 | kubectl -n "$ns" apply -f - >/dev/null || fail "Website shop not created"
is $v1/shop '{.spec.host}' shop.example.com || fail "spec.host not defaulted by the webhook"
until_ok 30 has $v1/shop '{.metadata.finalizers}' 'example.kinformer.dev/cleanup' || fail "finalizer"
until_ok 30 is deployment/shop '{.spec.replicas}' 2 || fail "Deployment shop with 2 replicas"
until_ok 30 is service/shop '{.spec.selector.app}' shop || fail "Service shop selecting app=shop"
is deployment/shop '{.spec.template.spec.containers[0].name}' web || fail "container name"
is deployment/shop '{.spec.template.spec.containers[0].image}' nginx:1.27 || fail "image"
is deployment/shop '{.spec.template.spec.containers[0].ports[0].containerPort}' 80 || fail "container port"
is deployment/shop '{.spec.template.spec.containers[0].env[?(@.name=="WEBSITE_HOST")].value}' shop.example.com \
    || fail "WEBSITE_HOST (the defaulted spec.host)"
is deployment/shop '{.spec.selector.matchLabels.app}' shop || fail "Deployment selector"
is deployment/shop '{.spec.template.metadata.labels.app}' shop || fail "pod labels"
is service/shop '{.spec.ports[0].port}' 80 || fail "Service port"
uid="$(jp $v1/shop '{.metadata.uid}')"
for kind in deployment service; do
    is "$kind/shop" '{.metadata.ownerReferences[0].uid}' "$uid" || fail "$kind owner"
    is "$kind/shop" '{.metadata.ownerReferences[0].controller}' true || fail "$kind controller owner"
    has "$kind/shop" '{.metadata.managedFields[?(@.operation=="Apply")].manager}' website-controller \
        || fail "$kind applied by website-controller"
done
ok

step "status.readyReplicas follows the Deployment"
until_ok 30 is $v1/shop '{.status.readyReplicas}' 0 || fail "status.readyReplicas 0"
kubectl -n "$ns" patch deployment shop --subresource=status --type=merge \
    -p '{"status":{"replicas":2,"readyReplicas":2}}' >/dev/null
until_ok 30 is $v1/shop '{.status.readyReplicas}' 2 || fail "status.readyReplicas 2"
ok

step "a deleted Service is created again"
kubectl -n "$ns" delete service shop --wait=true >/dev/null
until_ok 30 is service/shop '{.spec.selector.app}' shop || fail "Service not recreated"
ok

step "a spec change reaches the Deployment"
kubectl -n "$ns" patch "$v1" shop --type=merge -p '{"spec":{"replicas":3}}' >/dev/null
until_ok 30 is deployment/shop '{.spec.replicas}' 3 || fail "replicas 3"
ok

step "more than 10 replicas: refused with the webhook's message"
out="$(website big 11 | kubectl -n "$ns" apply -f - 2>&1)" && fail "a Website with 11 replicas was created"
grep -q 'spec.replicas must be 0 to 10, not 11' <<<"$out" || fail "create refused without the message: $out"
out="$(kubectl -n "$ns" patch "$v1" shop --type=merge -p '{"spec":{"replicas":12}}' 2>&1)" \
    && fail "shop was updated to 12 replicas"
grep -q 'spec.replicas must be 0 to 10, not 12' <<<"$out" || fail "update refused without the message: $out"
ok

step "an image without a tag: admitted, with a warning"
out="$(website latest 1 nginx | kubectl -n "$ns" apply -f - 2>&1)" || fail "Website latest refused: $out"
grep -q 'Warning:.*spec.image nginx has no tag' <<<"$out" || fail "no warning: $out"
ok

step "conversion: v1 read in v2, v2 written and read in v1"
v2() { kubectl -n "$ns" get "websites.v2.example.kinformer.dev/$1" -o "jsonpath=$2" 2>/dev/null; }
[ "$(v2 shop '{.spec.host} {.spec.pods.image} {.spec.pods.replicas} {.status.readyReplicas}')" \
    = "shop.example.com nginx:1.27 3 2" ] || fail "shop in v2: $(v2 shop '{.spec}')"
website blog 1 "httpd:2.4" v2 | kubectl -n "$ns" apply -f - >/dev/null || fail "Website blog (v2) not created"
is $v1/blog '{.spec.host} {.spec.image} {.spec.replicas}' "blog.example.org httpd:2.4 1" \
    || fail "blog in v1: $(jp $v1/blog '{.spec}')"
until_ok 30 is deployment/blog '{.spec.template.spec.containers[0].image}' httpd:2.4 || fail "no Deployment for blog"
[ "$(v2 blog '{.spec.host} {.spec.pods.image} {.spec.pods.replicas}')" = "blog.example.org httpd:2.4 1" ] \
    || fail "blog back in v2: $(v2 blog '{.spec}')"
kubectl -n "$ns" get websites.v2.example.kinformer.dev -o name | grep -q website.example.kinformer.dev/shop \
    || fail "the list in v2"
ok

step "a failing reconcile records a Warning Event"
# Admitted, but its Deployment is not: a quota allows no more Deployments here.
# (No quota controller runs here: its status is written as it would write it.)
kubectl -n "$ns" create quota no-deployments --hard=count/deployments.apps=0 >/dev/null || fail "quota"
kubectl -n "$ns" patch quota no-deployments --subresource=status --type=merge \
    -p '{"status":{"hard":{"count/deployments.apps":"0"},"used":{"count/deployments.apps":"0"}}}' >/dev/null
quota_in_force() { ! kubectl -n "$ns" create deployment probe --image=nginx:1.27 --dry-run=server >/dev/null 2>&1; }
until_ok 30 quota_in_force || fail "quota no-deployments never in force"
website broken 1 | kubectl -n "$ns" apply -f - >/dev/null || fail "Website broken not created"
until_ok 60 bash -c "kubectl -n $ns get events --field-selector type=Warning,involvedObject.name=broken,involvedObject.kind=Website -o name | grep -q ." \
    || fail "no Warning Event about Website broken"
kubectl -n "$ns" delete quota no-deployments >/dev/null
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
echo "--- controller log: $log"
echo "PASS"
