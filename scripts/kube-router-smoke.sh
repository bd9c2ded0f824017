#!/usr/bin/env bash
# Shows the kube-router add-on routing the pod network between two nodes,
# without kubelets: the objects the kube-on-kube-operator renders for it (its
# golden file), the image of scripts/node-images.sh, a real kube-apiserver and
# etcd (scripts/testenv-bins.sh) and the CNI plugins of
# scripts/node-artifacts.sh.
#
# In network namespaces of their own (nothing changes on the host's network):
# a "lab" namespace holds a bridge, etcd and kube-apiserver; two "node"
# namespaces hang on the bridge (10.77.0.11 and .12) and get a Node object each,
# with spec.podCIDR 10.244.1.0/24 and 10.244.2.0/24. The add-on's RBAC and
# ConfigMap are applied; in each node namespace kube-router runs from the
# image's root filesystem (chroot) with the DaemonSet's arguments, its
# ServiceAccount token and kubeconfig, as the init container leaves the CNI
# configuration. Then it checks that
#   1. each node gets the route to the other's podCIDR through the other node,
#   2. kube-router wrote the node's podCIDR into the CNI configuration,
#   3. a "pod" set up by the bridge + host-local plugins with that
#      configuration on node 1 reaches one on node 2 over HTTP (agnhost
#      netexec, which answers with the client's address: the pod's, not
#      masqueraded),
#   4. kube-proxy runs with the kube-proxy add-on's configuration in node 1's
#      namespace (where nf_conntrack_max is read-only), and pod 1 reaches pod 2
#      through a ClusterIP Service,
#   5. the API refused kube-router nothing (the add-on's ClusterRole).
# Everything it starts is stopped and removed at the end.
#
#   scripts/kube-router-smoke.sh            # as root
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" != --in-mountns ]; then
  [ "$(id -u)" = 0 ] || { echo "kube-router-smoke needs root (network namespaces, chroot)" >&2; exit 1; }
  "$here/node-images.sh" >/dev/null
  "$here/node-artifacts.sh" >/dev/null
  "$here/testenv-bins.sh" >/dev/null
  exec unshare --mount --propagation private -- "$0" --in-mountns
fi

log() { echo "[kube-router-smoke] $*" >&2; }
die() {
  log "FAILED: $*"
  for f in "${s:-/nonexistent}"/kube-*.log; do [ -f "$f" ] && { log "--- ${f##*/}"; tail -n 25 "$f" >&2; }; done
  exit 1
}
images=$("$here/node-images.sh" | tail -n1)
nodedir=$("$here/node-artifacts.sh" | tail -n1)
k8s=$("$here/testenv-bins.sh" | tail -n1)
golden="$here/../crates/kube-on-kube-operator/src/render/addons/golden/kube-router.yaml"
image=$(grep -o 'docker.io/cloudnativelabs/kube-router:[^@]*' "$images/images.txt")
[ "$(grep -m1 -o 'docker.io/cloudnativelabs/kube-router:v[0-9.]*' "$golden")" = "$image" ] ||
  die "the add-on renders another image than $image"

s=$(mktemp -d /tmp/kok-kube-router-smoke.XXXXXX)
p=krs$$
lab=$p-lab
pids=()
cleanup() {
  set +e
  # Each pid is the program itself (ip netns exec, unshare, sh and chroot
  # exec it); kube-apiserver may take its time to stop.
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for _ in $(seq 50); do
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && break; done || break
    sleep 0.2
  done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  for ns in $lab $p-n1 $p-n2 $p-p1 $p-p2; do ip netns del "$ns" 2>/dev/null; done
  grep " $s/" /proc/self/mounts | awk '{print $2}' | sort -r | xargs -r umount -l 2>/dev/null
  rm -rf "$s"
}
trap cleanup EXIT
in_lab() { ip netns exec "$lab" "$@"; }
kubectl() { in_lab "$k8s/kubectl" --kubeconfig "$s/admin.kubeconfig" "$@"; }
wait_for() { # what seconds command...
  local what=$1 secs=$2
  shift 2
  for _ in $(seq $((secs * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  die "$what (waited ${secs}s)"
}

# --- the network: a bridge in the lab, one veth per node -----------------------
ip netns add "$lab"
in_lab ip link set lo up
in_lab ip link add br0 type bridge
in_lab ip addr add 10.77.0.1/24 dev br0
in_lab ip link set br0 up
for n in 1 2; do
  ip netns add "$p-n$n"
  ip -n "$p-n$n" link set lo up
  ip link add "$p-v$n" netns "$lab" type veth peer name eth0 netns "$p-n$n"
  in_lab ip link set "$p-v$n" master br0 up
  ip -n "$p-n$n" addr add "10.77.0.1$n/24" dev eth0
  ip -n "$p-n$n" link set eth0 up
done

# --- etcd and kube-apiserver in the lab ---------------------------------------
mkdir -p "$s/etcd" "$s/apiserver"
openssl genrsa -out "$s/sa.key" 2048 2>/dev/null
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "$token,admin,admin,system:masters" >"$s/tokens.csv"
ip netns exec "$lab" "$k8s/etcd" --data-dir "$s/etcd" --listen-client-urls http://127.0.0.1:2379 \
  --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
  >"$s/etcd.log" 2>&1 &
pids+=($!)
ip netns exec "$lab" "$k8s/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
  --bind-address 10.77.0.1 --advertise-address 10.77.0.1 --secure-port 6443 \
  --cert-dir "$s/apiserver" --token-auth-file "$s/tokens.csv" --authorization-mode RBAC --allow-privileged \
  --service-account-key-file "$s/sa.key" --service-account-signing-key-file "$s/sa.key" \
  --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range 10.96.0.0/12 \
  >"$s/apiserver.log" 2>&1 &
pids+=($!)
cat >"$s/admin.kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster: {server: "https://10.77.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: "$token"}
contexts:
- name: lab
  context: {cluster: lab, user: admin}
current-context: lab
YAML
wait_for "kube-apiserver to be ready" 120 kubectl get --raw /readyz
log "kube-apiserver ready on 10.77.0.1:6443"

# --- the add-on's objects and two Nodes ---------------------------------------
wait_for "the kube-system namespace" 30 kubectl get namespace kube-system
kubectl apply --server-side -f "$golden" >/dev/null
for n in 1 2; do
  kubectl apply --server-side -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata: {name: node-$n}
spec: {podCIDR: 10.244.$n.0/24, podCIDRs: [10.244.$n.0/24]}
YAML
  kubectl patch node "node-$n" --subresource=status --type=merge \
    -p "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"10.77.0.1$n\"},{\"type\":\"Hostname\",\"address\":\"node-$n\"}]}}" >/dev/null
done
sa_token=$(kubectl -n kube-system create token kube-router --duration 1h)
kubectl -n kube-system get configmap kube-router-cfg -o 'jsonpath={.data.cni-conf\.json}' >"$s/cni-conf.json"
# The endpoint the operator would write is the Cluster's; here, the lab's.
kubectl -n kube-system get configmap kube-router-cfg -o 'jsonpath={.data.kubeconfig\.conf}' |
  sed 's|server: .*|server: "https://10.77.0.1:6443"|' >"$s/kubeconfig.conf"
args=$(kubectl -n kube-system get daemonset kube-router \
  -o 'jsonpath={range .spec.template.spec.containers[0].args[*]}{@}{"\n"}{end}')
log "kube-router args: ${args//$'\n'/ }"

# --- kube-router in each node namespace ---------------------------------------
# rootfs DIR LAYER...: an image's root filesystem from its layer tarballs.
rootfs() {
  local dir=$1 layer
  shift
  mkdir -p "$dir"
  for layer in "$@"; do tar -C "$dir" -xf "$images/layers/$layer"; done
  mkdir -p "$dir/dev"
}
# in_node N ROOTFS HOST-DIR:PATH... -- COMMAND...: COMMAND chrooted into ROOTFS
# in node N's network namespace, like a hostNetwork container: /proc, /sys,
# /dev, /lib/modules and the given directories mounted. The program keeps the
# pid (ip netns exec, unshare, sh and chroot exec it).
in_node() {
  local n=$1 r=$2
  shift 2
  # shellcheck disable=SC2016 # the inner shell expands them
  ip netns exec "$p-n$n" unshare --mount --propagation private -- sh -c '
    set -e; r=$1; shift
    mount -t proc proc "$r/proc"
    mount --rbind /sys "$r/sys"
    mount --rbind /dev "$r/dev"
    if [ -d /lib/modules ]; then mkdir -p "$r/lib/modules"; mount --rbind /lib/modules "$r/lib/modules"; fi
    while [ "$1" != -- ]; do mkdir -p "$r${1#*:}"; mount --bind "${1%%:*}" "$r${1#*:}"; shift; done
    shift
    exec chroot "$r" "$@"' sh "$r" "$@"
}
# service_account DIR TOKEN: what a Pod finds in /var/run/secrets/kubernetes.io/serviceaccount.
service_account() {
  mkdir -p "$1"
  printf '%s' "$2" >"$1/token"
  # The apiserver's self-signed certificate (with its CA) stands for the cluster CA.
  cp "$s/apiserver/apiserver.crt" "$1/ca.crt"
}

rootfs "$s/router-fs" kube-router-base.tar "kube-router-${image##*:}.tar"
for n in 1 2; do
  d="$s/n$n"
  mkdir -p "$d/cni" "$d/cfg" "$d/run" "$d/ipam"
  cp "$s/cni-conf.json" "$s/kubeconfig.conf" "$d/cfg/"
  service_account "$d/router-sa" "$sa_token"
  # The install-cni init container's work: the configuration, once.
  cp "$d/cfg/cni-conf.json" "$d/cni/10-kuberouter.conflist"
  # shellcheck disable=SC2086
  in_node "$n" "$s/router-fs" "$d/run:/run" "$d/router-sa:/run/secrets/kubernetes.io/serviceaccount" \
    "$d/cni:/etc/cni/net.d" "$d/cfg:/etc/kube-router" -- \
    env NODE_NAME="node-$n" POD_NAME="kube-router-$n" KUBE_ROUTER_CNI_CONF_FILE=/etc/cni/net.d/10-kuberouter.conflist \
    /usr/local/bin/kube-router $args >"$s/kube-router-$n.log" 2>&1 &
  pids+=($!)
done

# 1. Routes to the other node's podCIDR, through it.
has_route() { ip -n "$p-n$1" route show "$2" | grep -q "via $3 "; }
wait_for "node 1's route to 10.244.2.0/24 via 10.77.0.12 (kube-router log: $s/kube-router-1.log)" 90 \
  has_route 1 10.244.2.0/24 10.77.0.12
wait_for "node 2's route to 10.244.1.0/24 via 10.77.0.11" 90 has_route 2 10.244.1.0/24 10.77.0.11
log "node 1: $(ip -n "$p-n1" route show 10.244.2.0/24)"
log "node 2: $(ip -n "$p-n2" route show 10.244.1.0/24)"

# 2. The node's podCIDR in its CNI configuration.
for n in 1 2; do
  grep -q "10.244.$n.0/24" "$s/n$n/cni/10-kuberouter.conflist" ||
    die "node $n's CNI configuration lacks its podCIDR: $(cat "$s/n$n/cni/10-kuberouter.conflist")"
done
log "node 1's CNI configuration: $(tr -d ' \n' <"$s/n1/cni/10-kuberouter.conflist")"

# 3. A pod on each node through the bridge plugin, with that configuration.
cni="$s/cni"
mkdir -p "$cni"
tar -C "$cni" -xzf "$nodedir/artifacts/"cni-plugins-linux-amd64-v*.tgz
declare -A podip
for n in 1 2; do
  ip netns add "$p-p$n"
  python3 - "$s/n$n/cni/10-kuberouter.conflist" "$s/n$n/ipam" >"$s/n$n/bridge.json" <<'PY'
import json, sys
conf = json.load(open(sys.argv[1]))
plugin = conf["plugins"][0]
plugin["cniVersion"], plugin["name"] = conf["cniVersion"], conf["name"]
plugin["ipam"]["dataDir"] = sys.argv[2]  # not the host's /var/lib/cni
print(json.dumps(plugin))
PY
  result=$(ip netns exec "$p-n$n" env CNI_COMMAND=ADD CNI_CONTAINERID="pod-$n" \
    CNI_NETNS="/run/netns/$p-p$n" CNI_IFNAME=eth0 CNI_PATH="$cni" "$cni/bridge" <"$s/n$n/bridge.json") ||
    die "CNI ADD on node $n: $result"
  podip[$n]=$(echo "$result" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ips"][0]["address"].split("/")[0])')
  log "pod on node $n: ${podip[$n]}"
done
agnhost_image=$(grep -o 'registry.k8s.io/e2e-test-images/agnhost:[^@]*' "$images/images.txt")
tar -C "$s" -xf "$images/layers/agnhost-${agnhost_image##*:}.tar" ./agnhost
ip netns exec "$p-p2" "$s/agnhost" netexec --http-port 8080 >"$s/netexec.log" 2>&1 &
pids+=($!)
# From pod 1 to pod 2 across the nodes, and back.
wait_for "pod 1 to reach pod 2 (agnhost netexec on ${podip[2]}:8080)" 30 \
  ip netns exec "$p-p1" curl -fsS --max-time 2 "http://${podip[2]}:8080/hostname"
seen=$(ip netns exec "$p-p1" curl -fsS --max-time 2 "http://${podip[2]}:8080/clientip")
[ "${seen%:*}" = "${podip[1]}" ] || die "pod 2 saw pod 1 as $seen, not ${podip[1]}"
log "pod 2 sees pod 1's request from $seen"
# 4. kube-proxy with the kube-proxy add-on's configuration in node 1's
# namespace, where nf_conntrack_max is read-only, and a ClusterIP Service
# whose endpoint is pod 2, reached from pod 1.
proxy_golden="${golden%/*}/kube-proxy.yaml"
kubectl apply --server-side -f "$proxy_golden" >/dev/null
proxy_image=$(grep -o 'registry.k8s.io/kube-proxy:[^@]*' "$images/images.txt")
rootfs "$s/proxy-fs" kube-proxy-base.tar "kube-proxy-${proxy_image##*:}.tar"
d="$s/n1"
mkdir -p "$d/proxy"
kubectl -n kube-system get configmap kube-proxy -o 'jsonpath={.data.config\.conf}' >"$d/proxy/config.conf"
kubectl -n kube-system get configmap kube-proxy -o 'jsonpath={.data.kubeconfig\.conf}' |
  sed 's|server: .*|server: "https://10.77.0.1:6443"|' >"$d/proxy/kubeconfig.conf"
service_account "$d/proxy-sa" "$(kubectl -n kube-system create token kube-proxy --duration 1h)"
# shellcheck disable=SC2016 # $(NODE_NAME) is the DaemonSet's
proxy_command=$(kubectl -n kube-system get daemonset kube-proxy \
  -o 'jsonpath={range .spec.template.spec.containers[0].command[*]}{@}{"\n"}{end}' | sed 's/$(NODE_NAME)/node-1/')
# shellcheck disable=SC2086
in_node 1 "$s/proxy-fs" "$d/run:/run" "$d/proxy-sa:/run/secrets/kubernetes.io/serviceaccount" \
  "$d/proxy:/var/lib/kube-proxy" -- $proxy_command >"$s/kube-proxy.log" 2>&1 &
pids+=($!)
wait_for "kube-proxy's healthz on node 1 (log: kube-proxy.log)" 60 \
  ip netns exec "$p-n1" curl -fsS --max-time 2 http://127.0.0.1:10256/healthz
kubectl apply --server-side -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: ["${podip[2]}"], conditions: {ready: true}, nodeName: node-2}]
YAML
cluster_ip=$(kubectl get service web -o 'jsonpath={.spec.clusterIP}')
wait_for "pod 1 to reach the Service web at $cluster_ip (log: kube-proxy.log)" 30 \
  ip netns exec "$p-p1" curl -fsS --max-time 2 "http://$cluster_ip/hostname"
seen=$(ip netns exec "$p-p1" curl -fsS --max-time 2 "http://$cluster_ip/clientip")
log "pod 1 -> Service $cluster_ip:80 -> pod 2, which sees $seen"
grep -q "Setting nf_conntrack_max" "$s/kube-proxy.log" && die "kube-proxy set nf_conntrack_max"

# The add-on's ClusterRole covers what kube-router reads.
! grep -i forbidden "$s"/kube-router-*.log >&2 || die "kube-router was refused by the API"
log "OK: kube-router routes each node's podCIDR to the other"
