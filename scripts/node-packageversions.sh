#!/usr/bin/env bash
# Prints the PackageVersions of the worker-node packages scripts/node-artifacts.sh
# builds (containerd, runc, cni-plugins, crictl, kubelet and the kubelet's next
# patch release, which nodes upgrade to), with every artifact's
# URL under BASE_URL and its real sha256, and a ClusterPackageVersion `default`
# naming them. BASE_URL is where the artifacts/ directory is served (flat).
#
#   scripts/node-packageversions.sh http://10.0.0.1:8080 | kubectl apply -f -
#   scripts/node-packageversions.sh BASE_URL --mirror 10.0.0.1:5000 --cgroup-v1 --restrict-oom-score-adj
#
# --mirror HOST:PORT  adds containerd hosts.toml files that make the registry at
#                     HOST:PORT (plain HTTP, storage of scripts/node-images.sh) the
#                     mirror of registry.k8s.io, docker.io, ghcr.io and quay.io;
#                     an image <host>/<repo> is read from its repository
#                     <host>/<repo> there, so Pods keep their upstream image names.
# --cgroup-v1         sets failCgroupV1: false in the kubelet configuration: kubelet
#                     1.35 refuses to start on a cgroup v1 host otherwise (v1 is
#                     deprecated upstream). A cgroup v2 host needs nothing.
# --restrict-oom-score-adj  sets containerd's restrict_oom_score_adj: on hosts whose
#                     root lacks CAP_SYS_RESOURCE (hosts that are themselves
#                     containers, like the SSH test hosts) no process may lower its
#                     oom_score_adj, and runc fails the pause container's -998.
#
# The kubelet unit passes the Machine's spec.kubelet.extraArgs (template key
# kubeletExtraArgs) on as flags: the SSH test hosts' --cgroup-root, for one.
set -euo pipefail

usage() { echo "usage: $0 BASE_URL [--mirror HOST:PORT] [--cgroup-v1] [--restrict-oom-score-adj]" >&2; exit 2; }
[ $# -ge 1 ] || usage
base=${1%/}
shift
case "$base" in http://*|https://*) ;; *) echo "BASE_URL must start with http:// or https://" >&2; exit 2 ;; esac
mirror="" cgroupv1=no restrict_oom=no
while [ $# -gt 0 ]; do
  case "$1" in
    --mirror) [ $# -ge 2 ] || usage; mirror=$2; shift 2 ;;
    --cgroup-v1) cgroupv1=yes; shift ;;
    --restrict-oom-score-adj) restrict_oom=yes; shift ;;
    *) usage ;;
  esac
done
if [ -n "$mirror" ] && ! [[ "$mirror" =~ ^[A-Za-z0-9.-]+(:[0-9]+)?$|^\[[0-9a-fA-F:]+\](:[0-9]+)?$ ]]; then
  echo "--mirror takes HOST:PORT, got $mirror" >&2
  exit 2
fi

here=$(cd "$(dirname "$0")" && pwd)
dir=$("$here/node-artifacts.sh" | tail -n1)
out="$dir/artifacts"
[ -s "$out/SHA256SUMS" ] && [ -s "$out/versions" ] || { echo "no SHA256SUMS or versions in $out" >&2; exit 1; }

sum() { awk -v f="$1" '$2 == f || $2 == "*"f {print $1}' "$out/SHA256SUMS"; }
ver() { awk -v p="$1" '$1 == p {print $2}' "$out/versions"; }
containerd=$(ver containerd) runc=$(ver runc) cni=$(ver cni-plugins) crictl=$(ver crictl) kubelet=$(ver kubelet)
kubelet_next=$(ver kubelet-next)
for v in containerd runc cni crictl kubelet kubelet_next; do
  [ -n "${!v}" ] || { echo "no $v version in $out/versions" >&2; exit 1; }
done
containerd_tgz="containerd-$containerd-linux-amd64.tar.gz"
cni_tgz="cni-plugins-linux-amd64-v$cni.tgz"
crictl_tgz="crictl-v$crictl-linux-amd64.tar.gz"
for f in "$containerd_tgz" runc.amd64 "$cni_tgz" "$crictl_tgz" kubelet "kubelet-v$kubelet_next"; do
  [ -n "$(sum "$f")" ] || { echo "no checksum of $f in $out/SHA256SUMS" >&2; exit 1; }
done

# hosts.toml of one upstream registry, indented for a YAML block scalar.
hosts_toml() { # registry-host upstream-server
  cat <<TOML
    - path: /etc/containerd/certs.d/$1/hosts.toml
      template: |
        server = "$2"
        [host."http://$mirror/v2/$1"]
          capabilities = ["pull", "resolve"]
          override_path = true
TOML
}

# The PackageVersion of one kubelet release.
kubelet_pv() { # version artifact
cat <<YAML
---
apiVersion: kubeonkube.io/v1alpha1
kind: PackageVersion
metadata:
  name: kubelet-$1
spec:
  package: kubelet
  version: $1
  dependsOn: [containerd, cni-plugins]
  artifacts:
  - arch: amd64
    url: $base/$2
    sha256: "$(sum "$2")"
    format: Binary
  install:
    requiresDrain: true
    binaries:
    - path: bin/kubelet
      link: /usr/local/bin/kubelet
    files:
    - path: /var/lib/kubelet/config.yaml
      template: |
        apiVersion: kubelet.config.k8s.io/v1beta1
        kind: KubeletConfiguration
        authentication:
          x509:
            clientCAFile: /etc/kubernetes/pki/ca.crt
          webhook:
            enabled: true
        authorization:
          mode: Webhook
        clusterDNS: [{{ clusterDNS | yaml }}]
        clusterDomain: {{ clusterDomain | yaml }}
        rotateCertificates: true
        serverTLSBootstrap: true
        registerWithTaints: {{ registerTaints | yaml }}
        kubeReserved: {{ kubeReserved | yaml }}
        systemReserved: {{ systemReserved | yaml }}
        evictionHard: {{ evictionHard | yaml }}
        containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
YAML
[ $cgroupv1 = yes ] && echo "        failCgroupV1: false"
cat <<YAML
    systemdUnit:
      name: kubelet.service
      content: |
        [Unit]
        Description=kubelet
        After=containerd.service
        Requires=containerd.service
        [Service]
        ExecStart=/usr/local/bin/kubelet --config=/var/lib/kubelet/config.yaml --bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf --hostname-override={{ nodeName | systemd }} --node-ip={{ nodeIP | systemd }} --node-labels={{ nodeLabels | systemd }}{% for flag, value in kubeletExtraArgs | items %} --{{ flag }}={{ value | systemd }}{% endfor %}
        Restart=always
        [Install]
        WantedBy=multi-user.target
  healthCheck:
    httpGet: http://127.0.0.1:10248/healthz
    timeoutSeconds: 120
YAML
}

cat <<YAML
# Generated by scripts/node-packageversions.sh from $out/SHA256SUMS
apiVersion: kubeonkube.io/v1alpha1
kind: PackageVersion
metadata:
  name: runc-$runc
spec:
  package: runc
  version: $runc
  artifacts:
  - arch: amd64
    url: $base/runc.amd64
    sha256: "$(sum runc.amd64)"
    format: Binary
  install:
    binaries:
    - path: bin/runc
      link: /usr/local/sbin/runc
  healthCheck:
    command: [/usr/local/sbin/runc, --version]
---
apiVersion: kubeonkube.io/v1alpha1
kind: PackageVersion
metadata:
  name: containerd-$containerd
spec:
  package: containerd
  version: $containerd
  dependsOn: [runc]
  artifacts:
  - arch: amd64
    url: $base/$containerd_tgz
    sha256: "$(sum "$containerd_tgz")"
  install:
    binaries:
    - path: bin/containerd
      link: /usr/local/bin/containerd
    - path: bin/containerd-shim-runc-v2
      link: /usr/local/bin/containerd-shim-runc-v2
    - path: bin/ctr
      link: /usr/local/bin/ctr
    files:
    - path: /etc/containerd/config.toml
      template: |
        version = 3
YAML
[ $restrict_oom = yes ] && printf "        [plugins.'io.containerd.cri.v1.runtime']\n          restrict_oom_score_adj = true\n"
cat <<YAML
        [plugins.'io.containerd.cri.v1.runtime'.cni]
          bin_dirs = ['/opt/cni/bin']
          conf_dir = '/etc/cni/net.d'
        [plugins.'io.containerd.cri.v1.images'.registry]
          config_path = '/etc/containerd/certs.d'
        [plugins.'io.containerd.cri.v1.images'.pinned_images]
          sandbox = 'registry.k8s.io/pause:3.10.1'
YAML
if [ -n "$mirror" ]; then
  hosts_toml registry.k8s.io https://registry.k8s.io
  hosts_toml docker.io https://registry-1.docker.io
  hosts_toml ghcr.io https://ghcr.io
  hosts_toml quay.io https://quay.io
fi
cat <<YAML
    systemdUnit:
      name: containerd.service
      content: |
        [Unit]
        Description=containerd container runtime
        After=network.target
        [Service]
        ExecStartPre=-/sbin/modprobe overlay
        ExecStart=/usr/local/bin/containerd
        Restart=always
        Delegate=yes
        KillMode=process
        LimitNOFILE=infinity
        [Install]
        WantedBy=multi-user.target
    # KillMode=process keeps containers running across a containerd restart,
    # so removing containerd first ends every container it still runs (the
    # node's DaemonSet Pods after a drain), as kubeadm reset does.
    beforeRemove:
    - /bin/sh
    - -c
    - |
      for ns in \$(/usr/local/bin/ctr namespaces list -q); do
        for t in \$(/usr/local/bin/ctr -n "\$ns" tasks list -q); do
          /usr/local/bin/ctr -n "\$ns" tasks delete --force "\$t" >/dev/null || echo "task \$t of \$ns: not deleted"
        done
      done
      # A shim exits once its tasks are gone; one still there after 10 s
      # serves no task of this containerd, which is going.
      for i in \$(seq 20); do pgrep -x containerd-shim >/dev/null || exit 0; sleep 0.5; done
      pkill -x containerd-shim || true
  # containerd answers \`ctr version\` even when its CRI plugin failed to load
  # (a bad config, or no inotify instance left at start), and the kubelet
  # then finds no runtime: the check asks for the CRI plugin, and a
  # containerd without it is restarted once (node-operator), then reported.
  healthCheck:
    command:
    - /bin/sh
    - -c
    - |
      /usr/local/bin/ctr plugins ls id==cri | grep -q ' ok *\$' && exit 0
      echo "containerd's CRI plugin (io.containerd.grpc.v1.cri) is not loaded:"
      /usr/local/bin/ctr plugins ls -d id==cri | grep -A 3 '^Error:'
      exit 1
    timeoutSeconds: 60
---
apiVersion: kubeonkube.io/v1alpha1
kind: PackageVersion
metadata:
  name: cni-plugins-$cni
spec:
  package: cni-plugins
  version: $cni
  artifacts:
  - arch: amd64
    url: $base/$cni_tgz
    sha256: "$(sum "$cni_tgz")"
  install:
    binaries:
YAML
for p in $(tar -tzf "$out/$cni_tgz" | sed 's|^\./||' | grep -vE '^$|^(LICENSE|README.md)$' | sort); do
  printf '    - path: %s\n      link: /opt/cni/bin/%s\n' "$p" "$p"
done
cat <<YAML
  healthCheck:
    command: [/opt/cni/bin/bridge, --version]
---
apiVersion: kubeonkube.io/v1alpha1
kind: PackageVersion
metadata:
  name: crictl-$crictl
spec:
  package: crictl
  version: $crictl
  dependsOn: [containerd]
  artifacts:
  - arch: amd64
    url: $base/$crictl_tgz
    sha256: "$(sum "$crictl_tgz")"
  install:
    binaries:
    - path: crictl
      link: /usr/local/bin/crictl
    files:
    - path: /etc/crictl.yaml
      template: |
        runtime-endpoint: unix:///run/containerd/containerd.sock
        image-endpoint: unix:///run/containerd/containerd.sock
        timeout: 10
  healthCheck:
    command: [/usr/local/bin/crictl, info]
    timeoutSeconds: 60
YAML
kubelet_pv "$kubelet" kubelet
kubelet_pv "$kubelet_next" "kubelet-v$kubelet_next"
cat <<YAML
---
apiVersion: kubeonkube.io/v1alpha1
kind: ClusterPackageVersion
metadata:
  name: default
spec:
  packages:
    runc: runc-$runc
    containerd: containerd-$containerd
    cni-plugins: cni-plugins-$cni
    crictl: crictl-$crictl
    kubelet: kubelet-$kubelet
YAML
