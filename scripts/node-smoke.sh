#!/usr/bin/env bash
# Runs the worker-node pieces together once, the way a node uses them, to show
# that they work: the containerd, runc, CNI plugins and crictl built by
# scripts/node-artifacts.sh, the images of scripts/node-images.sh served by the
# registry of scripts/registry-bins.sh.
#
# In a network namespace of its own (nothing changes on the host's network) it
# starts the registry on loopback over the image storage and containerd with a
# scratch root and state, a registry.k8s.io mirror (hosts.toml) pointing at the
# registry, and the CNI bridge plugin. Through the CRI (crictl) it pulls
# agnhost, runs a pod sandbox (pause, pulled through the mirror) with agnhost
# netexec in it, fetches a page from the pod's IP, execs a shell in it and prints
# its logs; through containerd's own API (ctr) it runs `agnhost --help`, the
# CoreDNS binary and kube-proxy with its iptables/nftables/conntrack tools once.
# Last the kubelet (standalone, no API server) runs a static agnhost Pod on the
# same containerd, in a cgroup root of its own.
# Everything it starts is stopped and removed at the end.
#
#   scripts/node-smoke.sh            # as root
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" != --in-netns ]; then
  [ "$(id -u)" = 0 ] || { echo "node-smoke needs root (containers, network namespace)" >&2; exit 1; }
  # Build (or find) everything first, outside the namespace.
  "$here/node-artifacts.sh" >/dev/null
  "$here/node-images.sh" >/dev/null
  "$here/registry-bins.sh" >/dev/null
  exec unshare --net --mount --propagation private -- "$0" --in-netns
fi

log() { echo "[node-smoke] $*" >&2; }
say() { echo "+ $*" >&2; "$@"; }
nodedir=$("$here/node-artifacts.sh" | tail -n1)
images=$("$here/node-images.sh" | tail -n1)
tools=$("$here/registry-bins.sh" | tail -n1)
bin="$nodedir/bin"
ip link set lo up

s=$(mktemp -d /tmp/kok-node-smoke.XXXXXX)
# Paths containerd, its shim and libcni use whatever the configuration says;
# removed at the end unless they were there before.
created=()
for p in /run/containerd /var/lib/cni /var/log/pods /var/log/containers; do [ -e "$p" ] || created+=("$p"); done
cgparent=kok-node-smoke-$$
regpid="" cpid="" kpid=""
cleanup() {
  set +e
  [ -n "$kpid" ] && { kill "$kpid" 2>/dev/null; wait "$kpid" 2>/dev/null; }
  if [ -n "$cpid" ]; then
    "$bin/crictl" --runtime-endpoint "unix://$s/containerd.sock" rmp -fa >/dev/null 2>&1
    kill "$cpid" 2>/dev/null; wait "$cpid" 2>/dev/null
  fi
  [ -n "$regpid" ] && { kill "$regpid" 2>/dev/null; wait "$regpid" 2>/dev/null; }
  # shims left behind by a failed run
  for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $s/containerd.sock"); do kill "$p" 2>/dev/null; done
  grep " $s/" /proc/self/mounts | awk '{print $2}' | sort -r | xargs -r umount -l 2>/dev/null
  for c in /sys/fs/cgroup/*/"$cgparent" /sys/fs/cgroup/*/*/"$cgparent"; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  rm -rf "$s"
  for p in "${created[@]}"; do rm -rf "$p"; done
}
trap cleanup EXIT

# --- registry on loopback over the image storage ------------------------------
cat >"$s/registry.yml" <<YAML
version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: $images/registry}
  maintenance: {readonly: {enabled: true}}
http:
  addr: 127.0.0.1:5000
YAML
"$tools/registry" serve "$s/registry.yml" >"$s/registry.log" 2>&1 &
regpid=$!
for _ in $(seq 100); do curl -fsS http://127.0.0.1:5000/v2/ >/dev/null 2>&1 && break; sleep 0.1; done
log "registry: $(curl -fsS http://127.0.0.1:5000/v2/_catalog)"

# --- containerd ---------------------------------------------------------------
mkdir -p "$s/certs.d/registry.k8s.io" "$s/net.d"
cat >"$s/certs.d/registry.k8s.io/hosts.toml" <<'TOML'
server = "https://registry.k8s.io"
[host."http://127.0.0.1:5000/v2/registry.k8s.io"]
  capabilities = ["pull", "resolve"]
  override_path = true
TOML
cat >"$s/net.d/10-bridge.conflist" <<'JSON'
{"cniVersion": "1.0.0", "name": "smoke", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
# Without CAP_SYS_RESOURCE (as on this test machine) no process may lower its
# oom_score_adj, and runc fails the pause container's -998: bound it to
# containerd's own instead.
restrict_oom=false
grep -q '^CapEff:' /proc/self/status && [ $(( 0x$(awk '/^CapEff:/ {print $2}' /proc/self/status) >> 24 & 1 )) = 0 ] && restrict_oom=true
cat >"$s/config.toml" <<TOML
version = 3
root = '$s/root'
state = '$s/state'
[grpc]
  address = '$s/containerd.sock'
[ttrpc]
  address = '$s/containerd.sock.ttrpc'
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = $restrict_oom
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ['$bin/cni']
  conf_dir = '$s/net.d'
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = '$bin/runc'
[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = '$s/certs.d'
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = 'registry.k8s.io/pause:3.10.1'
TOML
PATH="$bin:$PATH" "$bin/containerd" --config "$s/config.toml" >"$s/containerd.log" 2>&1 &
cpid=$!
for _ in $(seq 200); do [ -S "$s/containerd.sock" ] && break; sleep 0.1; done
crictl() { "$bin/crictl" --runtime-endpoint "unix://$s/containerd.sock" --image-endpoint "unix://$s/containerd.sock" --timeout 60s "$@"; }
ctr() { "$bin/ctr" --address "$s/containerd.sock" --namespace k8s.io "$@"; }
for _ in $(seq 100); do crictl info >/dev/null 2>&1 && break; sleep 0.2; done

say "$bin/containerd" --version
say "$bin/runc" --version
say crictl version
say crictl pull registry.k8s.io/e2e-test-images/agnhost:2.59
cat >"$s/pod.json" <<JSON
{"metadata": {"name": "smoke", "namespace": "default", "uid": "smoke-$$", "attempt": 0},
 "hostname": "smoke-pod", "log_directory": "$s/logs",
 "linux": {"cgroup_parent": "/$cgparent"}}
JSON
cat >"$s/ctr.json" <<'JSON'
{"metadata": {"name": "netexec"}, "image": {"image": "registry.k8s.io/e2e-test-images/agnhost:2.59"},
 "args": ["netexec", "--http-port=8080"], "log_path": "netexec.log"}
JSON
pod=$(say crictl runp "$s/pod.json")
ctrid=$(say crictl create "$pod" "$s/ctr.json" "$s/pod.json")
say crictl start "$ctrid" >/dev/null
say crictl images
podip=$(crictl inspectp "$pod" | sed -n 's/.*"ip": "\([0-9.]*\)".*/\1/p' | head -n1)
log "pod IP $podip"
for _ in $(seq 50); do curl -fsS "http://$podip:8080/hostname" >/dev/null 2>&1 && break; sleep 0.2; done
say curl -fsS "http://$podip:8080/hostname"; echo
say curl -fsS "http://$podip:8080/echo?msg=hello-from-the-node"; echo
say crictl exec "$ctrid" /bin/sh -c 'id; ip -4 addr show eth0 | grep inet; cat /etc/os-release | head -n1'
say crictl logs "$ctrid"
say crictl ps
ctr images pull --hosts-dir "$s/certs.d" registry.k8s.io/pause:3.10 >/dev/null
say ctr images ls -q
say ctr run --rm --runc-binary "$bin/runc" --cgroup "/$cgparent/ctr" registry.k8s.io/e2e-test-images/agnhost:2.59 smoke-ctr /agnhost --help | head -n 8
for i in registry.k8s.io/coredns/coredns:v1.12.1 registry.k8s.io/kube-proxy:v1.35.4; do
  ctr images pull --hosts-dir "$s/certs.d" "$i" >/dev/null
done
say ctr run --rm --runc-binary "$bin/runc" --cgroup "/$cgparent/coredns" registry.k8s.io/coredns/coredns:v1.12.1 smoke-coredns /coredns -version
say ctr run --rm --runc-binary "$bin/runc" --cgroup "/$cgparent/kube-proxy" registry.k8s.io/kube-proxy:v1.35.4 smoke-kube-proxy \
  sh -c '/usr/local/bin/kube-proxy --version; iptables --version; iptables-legacy --version; nft --version; conntrack --version; ipset --version 2>&1 | head -n1'

# --- the kubelet, standalone, running a static Pod on this containerd ----------
# On a cgroup v1 host kubelet 1.35 needs failCgroupV1: false; its cgroupRoot
# must exist in every hierarchy (one per kubelet when several share a machine).
for c in /sys/fs/cgroup/*/; do [ -e "$c/cgroup.procs" ] && mkdir -p "$c$cgparent/kubelet"; done
v1=false
[ -e /sys/fs/cgroup/cgroup.controllers ] || v1=true
mkdir -p "$s/manifests"
cat >"$s/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: $( [ $v1 = true ] && echo false || echo true )
cgroupDriver: cgroupfs
cgroupRoot: /$cgparent/kubelet
containerRuntimeEndpoint: unix://$s/containerd.sock
staticPodPath: $s/manifests
podLogsDir: $s/pod-logs
address: 127.0.0.1
healthzBindAddress: 127.0.0.1
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
failSwapOn: false
YAML
cat >"$s/manifests/web.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default}
spec:
  containers:
  - name: netexec
    image: registry.k8s.io/e2e-test-images/agnhost:2.59
    args: [netexec, --http-port=8080]
YAML
say "$bin/kubelet" --version
"$bin/kubelet" --config "$s/kubelet.yaml" --root-dir "$s/kubelet" --hostname-override smoke-node >"$s/kubelet.log" 2>&1 &
kpid=$!
webip=""
for _ in $(seq 120); do
  webpod=$(crictl pods -q --name '^web-smoke-node$' 2>/dev/null | head -n1)
  [ -n "$webpod" ] && webip=$(crictl inspectp "$webpod" | sed -n 's/.*"ip": "\([0-9.]*\)".*/\1/p' | head -n1)
  [ -n "$webip" ] && curl -fsS "http://$webip:8080/hostname" >/dev/null 2>&1 && break
  kill -0 "$kpid" 2>/dev/null || { tail -n 20 "$s/kubelet.log" >&2; exit 1; }
  sleep 1
done
say curl -fsS http://127.0.0.1:10248/healthz; echo
say curl -fsS "http://$webip:8080/hostname"; echo
# the kubelet's own view catches up with its status sync
for _ in $(seq 60); do
  curl -fsSk https://127.0.0.1:10250/pods | grep -q '"phase":"Running"' && break
  sleep 0.5
done
curl -fsSk https://127.0.0.1:10250/pods | python3 -c 'import json, sys
for p in json.load(sys.stdin)["items"]:
    print("kubelet /pods:", p["metadata"]["name"], p["status"].get("phase"), [c.get("ready") for c in p["status"].get("containerStatuses", [])])'
curl -fsSk https://127.0.0.1:10250/configz | python3 -c 'import json, sys
c = json.load(sys.stdin)["kubeletconfig"]
print("kubelet /configz:", {k: c.get(k) for k in ("failCgroupV1", "cgroupRoot", "cgroupDriver")})'
log "ok"
