#!/usr/bin/env bash
# One throw-away business cluster per CI run: create it and wait until it is
# Ready, write its kubeconfig, run a smoke test against it, and delete it when
# the script exits (also on failure or Ctrl-C).
#
# Needs `kubectl` and `kubectl-kok` on PATH and KUBECONFIG (or
# ~/.kube/config) pointing at the meta-cluster, where the kube-on-kube-operator
# runs. Settings, all optional:
#
#   KOK_CLUSTER_NAME   cluster name        (default: ci-<CI_PIPELINE_ID|GITHUB_RUN_ID|epoch>)
#   KOK_NAMESPACE      meta-cluster namespace of the Cluster   (default: default)
#   KOK_CLUSTER_FILE   Cluster manifest to start from (placement, users, …);
#                      without it: a Minimal cluster with etcd on emptyDir
#   KOK_VERSION        Kubernetes version  (default: the file's, else the CLI's)
#   KOK_TIMEOUT        how long to wait for Ready          (default: 10m)
#   KOK_API_SERVER     how this machine reaches the business API:
#                        empty      the Cluster's endpoint (status.endpoint), for
#                                   LoadBalancer/DNS exposure reachable from CI
#                        pod-ip     an apiserver Pod's address, for meta-clusters
#                                   whose Pod network is routed to the CI machine
#                                   (flat networks, and the project's test environment)
#                        https://…  this URL (a proxy, a port-forward)
#                      The certificate is still checked against the endpoint's name.
#   KOK_WORKDIR        where the kubeconfig is written     (default: a temp dir)
set -euo pipefail

name=${KOK_CLUSTER_NAME:-ci-${CI_PIPELINE_ID:-${GITHUB_RUN_ID:-$(date +%s)}}}
namespace=${KOK_NAMESPACE:-default}
timeout=${KOK_TIMEOUT:-10m}
workdir=${KOK_WORKDIR:-$(mktemp -d)}
kubeconfig="$workdir/$name.kubeconfig"

kok() { kubectl kok -n "$namespace" "$@"; }

cleanup() {
  status=$?
  echo "--- deleting cluster $name"
  if ! kok cluster delete "$name" --wait --timeout 5m; then
    echo "cluster $name was not deleted cleanly" >&2
    [ "$status" -ne 0 ] || status=1
  fi
  rm -f "$kubeconfig"
  exit "$status"
}

echo "--- creating cluster $name in namespace $namespace"
create=(cluster create "$name" --wait --timeout "$timeout")
if [ -n "${KOK_CLUSTER_FILE:-}" ]; then
  create+=(--from "$KOK_CLUSTER_FILE")
else
  create+=(--mode Minimal)
fi
if [ -n "${KOK_VERSION:-}" ]; then
  create+=(--version "$KOK_VERSION")
fi
# From here on the cluster exists (or half exists): always delete it.
trap cleanup EXIT
kok "${create[@]}"

echo "--- writing the kubeconfig"
server=()
case "${KOK_API_SERVER:-}" in
  "") ;;
  pod-ip)
    ip=$(kubectl get pods -n "$namespace" \
      -l "kubeonkube.io/cluster=$name,kubeonkube.io/component=apiserver" \
      -o jsonpath='{.items[?(@.status.podIP)].status.podIP}' | cut -d' ' -f1)
    [ -n "$ip" ] || { echo "no apiserver Pod with an address for $name" >&2; exit 1; }
    server=(--server "https://$ip:6443")
    ;;
  *) server=(--server "$KOK_API_SERVER") ;;
esac
kok cluster kubeconfig "$name" "${server[@]}" --output-file "$kubeconfig"

echo "--- smoke test"
k() { kubectl --kubeconfig "$kubeconfig" "$@"; }
k get --raw /readyz
echo
k get namespaces
value="run-$name-$$"
k create configmap kok-smoke -n default --from-literal=value="$value"
got=$(k get configmap kok-smoke -n default -o jsonpath='{.data.value}')
if [ "$got" != "$value" ]; then
  echo "smoke test failed: read back '$got', wrote '$value'" >&2
  exit 1
fi
echo "smoke test passed: ConfigMap written and read back"
