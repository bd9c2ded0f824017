#!/usr/bin/env bash
# Builds the container images worker nodes pull, from upstream sources and
# without a container engine, and stores them under their upstream names in an
# OCI registry's storage directory (github.com/distribution/distribution/v3):
#
#   registry.k8s.io/pause:3.10.1, :3.10      build/pause/linux/pause.c of k8s.io/kubernetes, gcc -static
#   registry.k8s.io/e2e-test-images/agnhost:2.59
#                                            k8s.io/kubernetes/test/images/agnhost on a Debian rootfs
#                                            with the tools upstream's image has (sh, curl, dig, nc, ip, iperf)
#   registry.k8s.io/coredns/coredns:v1.12.1  github.com/coredns/coredns
#   registry.k8s.io/kube-proxy:v1.35.4       k8s.io/kubernetes/cmd/kube-proxy on a Debian rootfs
#                                            with iptables, nftables, conntrack, ipset, kmod
#   docker.io/cloudnativelabs/kube-router:v2.1.0
#                                            github.com/cloudnativelabs/kube-router/v2 on a Debian
#                                            rootfs with iptables, ipset, iproute2, kmod, conntrack
#   registry.k8s.io/metrics-server/metrics-server:v0.7.2
#                                            sigs.k8s.io/metrics-server (the example add-on template)
#   registry.k8s.io/kas-network-proxy/proxy-agent:v0.34.0
#                                            sigs.k8s.io/apiserver-network-proxy/cmd/agent (the
#                                            konnectivity-agent add-on)
#
# With --e2e, also the images the upstream conformance suite runs (the names
# test/utils/image/manifest.go of $K8S_VERSION gives):
#
#   registry.k8s.io/e2e-test-images/busybox:1.37.0-1
#                                            busybox 1.37.0 (defconfig, static) from its source,
#                                            its applets linked in /bin
#   registry.k8s.io/e2e-test-images/nginx:1.14-4
#                                            Debian's nginx serving its default page on port 80
#   registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7
#                                            a Debian rootfs with dig, host and nslookup
#   registry.k8s.io/e2e-test-images/agnhost:2.55
#                                            the suite's previous agnhost (StatefulSet updates):
#                                            the same source, its version stamped 2.55
#   registry.k8s.io/e2e-test-images/nginx:1.15-4
#                                            the suite's newer nginx (rollouts): Debian's nginx
#                                            with its own tag layer
#   registry.k8s.io/e2e-test-images/kitten:1.7, nautilus:1.7
#                                            agnhost's test-webserver serving the image and
#                                            data.json of test/images/{kitten,nautilus} (kubectl's
#                                            Update Demo)
#   registry.k8s.io/e2e-test-images/sample-apiserver:1.29.2
#                                            k8s.io/sample-apiserver of $K8S_VERSION's staging
#                                            release (the aggregator test)
#   registry.k8s.io/etcd:3.6.6-0             go.etcd.io/etcd v3.6.6's etcd (etcdctl, etcdutl) in
#                                            /usr/local/bin (the sample API server's storage)
#   registry.k8s.io/e2e-test-images/nonewprivs:1.3
#                                            test/images/nonewprivs/nnp.go, set-user-ID root
#
# With --kubeadm, also the control-plane images `kubeadm init` of $K8S_VERSION
# runs as static Pods (the cluster benchmark's peer):
#
#   registry.k8s.io/kube-apiserver:v1.35.4, kube-controller-manager:v1.35.4,
#   kube-scheduler:v1.35.4                   k8s.io/kubernetes/cmd/<name> in /usr/local/bin,
#                                            alone on an empty base, as upstream's distroless
#                                            images carry them
#   registry.k8s.io/etcd:3.6.6-0             as with --e2e
#
# With --meta, also the images a business control plane runs on the
# meta-cluster when the kube-on-kube-operator renders it with its defaults,
# at the releases it defaults to and those its upgrade tests start from:
#
#   registry.k8s.io/kube-apiserver, kube-controller-manager, kube-scheduler
#     at v1.35.4 and v1.35.3                 as with --kubeadm
#   registry.k8s.io/etcd:3.6.16-0, :3.6.15-0 go.etcd.io/etcd's etcd, etcdctl and etcdutl in
#                                            /usr/local/bin, alone on an empty base (a
#                                            restoring member runs etcdutl)
#   registry.k8s.io/kas-network-proxy/proxy-server:v0.34.0
#                                            sigs.k8s.io/apiserver-network-proxy/cmd/server as
#                                            /proxy-server, user 65532 as upstream's (distroless
#                                            nonroot)
#   ghcr.io/versity/versitygw:v1.8.0         github.com/versity/versitygw/cmd/versitygw as
#                                            /usr/local/bin/versitygw, its entrypoint (the snapshot
#                                            gateway; the operator passes only arguments)
#   docker.io/rancher/local-path-provisioner:v0.0.30
#                                            github.com/rancher/local-path-provisioner as
#                                            /usr/bin/local-path-provisioner (the meta-cluster's
#                                            provisioner of etcd claims)
#   quay.io/metallb/controller:v0.15.2, quay.io/metallb/speaker:v0.15.2
#                                            go.universe.tf/metallb's controller and speaker
#                                            (the meta-cluster's LoadBalancer, L2 mode) as
#                                            /controller and /speaker, as upstream's images
#   kube-on-kube.test/operator-base:bookworm a Debian rootfs with openssh-client and
#                                            ca-certificates, user and group nonroot (65532, home
#                                            /home/nonroot): the operators' images are it plus one
#                                            layer with the binary (scripts/operator-images.sh,
#                                            which pushes it from the OCI layout operator-base.oci/
#                                            kept beside the storage into a registry that lacks it)
#
# With --meta, upstream's manifests of the last two, as their releases ship
# them, are copied to manifests/ beside the storage
# (local-path-storage.yaml, metallb-native.yaml).
#
# The script starts the registry on loopback, builds every layer as a
# reproducible tarball, and pushes with crane (scripts/registry-bins.sh builds
# both). Each image `<host>/<repo>:<tag>` is stored as the repository
# `<host>/<repo>`, so a registry serving this storage is containerd's mirror for
# <host> with a hosts.toml like
#
#   server = "https://registry.k8s.io"
#   [host."http://<registry>/v2/registry.k8s.io"]
#     capabilities = ["pull", "resolve"]
#     override_path = true
#
# and Pods keep their upstream image names.
#
# Idempotent: when every image is stored, it prints the directory and exits.
# Runs that start together build once: the others wait for the first (flock).
# The last line of the output is the directory; its registry/ subdirectory is
# the registry's storage (filesystem driver rootdirectory), images.txt lists
# each image with its digest.
#
# Needs go, gcc, mmdebstrap (Debian package; run as root) and network access to
# the Go module proxy and a Debian mirror (DEBIAN_MIRROR).
#
#   scripts/node-images.sh
#   scripts/node-images.sh --e2e
#   scripts/node-images.sh --e2e --meta
#   KOK_TESTENV_DIR=/some/dir scripts/node-images.sh
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.35.4}
PAUSE_VERSIONS=${PAUSE_VERSIONS:-3.10.1 3.10}
# The version test/utils/image/manifest.go of $K8S_VERSION asks for.
AGNHOST_VERSION=${AGNHOST_VERSION:-2.59}
# The version the coredns add-on template uses.
COREDNS_VERSION=${COREDNS_VERSION:-v1.12.1}
# The version the kube-router add-on template uses (the newest the Go module
# proxy serves).
KUBE_ROUTER_VERSION=${KUBE_ROUTER_VERSION:-v2.1.0}
# The version examples/addon-template-metrics-server.yaml uses.
METRICS_SERVER_VERSION=${METRICS_SERVER_VERSION:-v0.7.2}
# The version the konnectivity-agent add-on uses.
KONNECTIVITY_VERSION=${KONNECTIVITY_VERSION:-v0.34.0}
# What a business control plane runs (--meta): the releases the operator
# defaults to and those its upgrade tests start from (scripts/testenv-bins.sh
# builds the same as binaries; a leading v is dropped from etcd's).
K8S_FROM_VERSION=${K8S_FROM_VERSION:-v1.35.3}
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
ETCD_VERSION=${ETCD_VERSION#v}
ETCD_FROM_VERSION=${ETCD_FROM_VERSION:-3.6.15}
ETCD_FROM_VERSION=${ETCD_FROM_VERSION#v}
# The operator's default snapshot gateway (scripts/backup-bins.sh builds it).
VERSITYGW_VERSION=${VERSITYGW_VERSION:-v1.8.0}
# The meta-cluster's claim provisioner and load balancer (--meta).
LOCAL_PATH_VERSION=${LOCAL_PATH_VERSION:-v0.0.30}
METALLB_VERSION=${METALLB_VERSION:-v0.15.2}
DEBIAN_SUITE=${DEBIAN_SUITE:-bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

here=$(cd "$(dirname "$0")" && pwd)
root=${KOK_TESTENV_DIR:-$HOME/.cache/kube-on-kube}
# Each image's marker (done/<image>) is its cache key, so an image added since
# the directory was made (kube-router) is built alone into it; the directory's
# name keeps the versions it was first made for.
dir="$root/images-k8s-$K8S_VERSION-agnhost-$AGNHOST_VERSION-coredns-$COREDNS_VERSION-$DEBIAN_SUITE"
store="$dir/registry"
done_dir="$dir/done"
wanted=()
for v in $PAUSE_VERSIONS; do wanted+=("registry.k8s.io/pause:$v"); done
wanted+=("registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION"
  "registry.k8s.io/coredns/coredns:$COREDNS_VERSION"
  "registry.k8s.io/kube-proxy:$K8S_VERSION"
  "docker.io/cloudnativelabs/kube-router:$KUBE_ROUTER_VERSION"
  "registry.k8s.io/metrics-server/metrics-server:$METRICS_SERVER_VERSION"
  "registry.k8s.io/kas-network-proxy/proxy-agent:$KONNECTIVITY_VERSION")

# The conformance suite's images, with --e2e.
BUSYBOX_TAG=1.37.0-1
BUSYBOX_VERSION=1.37.0
BUSYBOX_SHA256=3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4
NGINX_TAG=1.14-4
NGINX_NEW_TAG=1.15-4
DNSUTILS_TAG=1.7
AGNHOST_PREV_VERSION=2.55
KITTEN_TAG=1.7
SAMPLE_APISERVER_TAG=1.29.2
NONEWPRIVS_TAG=1.3
E2E_ETCD_VERSION=3.6.6
# The operators' base: bookworm like the machine that builds them, whose
# glibc their dynamically linked binaries need.
OPERATOR_BASE=kube-on-kube.test/operator-base:$DEBIAN_SUITE
e2e=no
kubeadm=no
meta=no
for arg in "$@"; do
  case $arg in
    --e2e) e2e=yes ;;
    --kubeadm) kubeadm=yes ;;
    --meta) meta=yes ;;
    *) echo "unknown argument $arg (--e2e, --kubeadm, --meta)" >&2; exit 2 ;;
  esac
done
CONTROL_PLANE=(kube-apiserver kube-controller-manager kube-scheduler)
if [ $kubeadm = yes ]; then
  for b in "${CONTROL_PLANE[@]}"; do wanted+=("registry.k8s.io/$b:$K8S_VERSION"); done
  wanted+=("registry.k8s.io/etcd:$E2E_ETCD_VERSION-0")
fi
if [ $meta = yes ]; then
  for v in "$K8S_VERSION" "$K8S_FROM_VERSION"; do
    for b in "${CONTROL_PLANE[@]}"; do wanted+=("registry.k8s.io/$b:$v"); done
  done
  wanted+=("registry.k8s.io/etcd:$ETCD_VERSION-0" "registry.k8s.io/etcd:$ETCD_FROM_VERSION-0"
    "registry.k8s.io/kas-network-proxy/proxy-server:$KONNECTIVITY_VERSION"
    "ghcr.io/versity/versitygw:$VERSITYGW_VERSION"
    "docker.io/rancher/local-path-provisioner:$LOCAL_PATH_VERSION"
    "quay.io/metallb/controller:$METALLB_VERSION" "quay.io/metallb/speaker:$METALLB_VERSION"
    "$OPERATOR_BASE")
fi
if [ $e2e = yes ]; then
  wanted+=("registry.k8s.io/e2e-test-images/busybox:$BUSYBOX_TAG"
    "registry.k8s.io/e2e-test-images/nginx:$NGINX_TAG"
    "registry.k8s.io/e2e-test-images/jessie-dnsutils:$DNSUTILS_TAG"
    "registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_PREV_VERSION"
    "registry.k8s.io/e2e-test-images/nginx:$NGINX_NEW_TAG"
    "registry.k8s.io/e2e-test-images/kitten:$KITTEN_TAG"
    "registry.k8s.io/e2e-test-images/nautilus:$KITTEN_TAG"
    "registry.k8s.io/e2e-test-images/sample-apiserver:$SAMPLE_APISERVER_TAG"
    "registry.k8s.io/etcd:$E2E_ETCD_VERSION-0"
    "registry.k8s.io/e2e-test-images/nonewprivs:$NONEWPRIVS_TAG")
fi

marker() { echo "$done_dir/$(echo "$1" | tr '/:' '__')"; }
# A busybox image a cache holds from before it was built from source is
# built again (its stamp says how it was made).
busybox_stamp="$done_dir/busybox-$BUSYBOX_VERSION-from-source"
if [ $e2e = yes ] && [ ! -e "$busybox_stamp" ]; then
  rm -f "$(marker "registry.k8s.io/e2e-test-images/busybox:$BUSYBOX_TAG")"
fi
# The operators' base is also kept as an OCI layout (operator-base.oci/), from
# which scripts/operator-images.sh pushes it, compressed blobs as stored, into
# a registry that lacks it.
have_operator_base() {
  [ -s "$(marker "$OPERATOR_BASE")" ] && [ -s "$dir/operator-base.oci/index.json" ]
}
have_manifests() {
  [ -s "$dir/manifests/local-path-storage.yaml" ] && [ -s "$dir/manifests/metallb-native.yaml" ]
}
have_all() {
  local i
  for i in "${wanted[@]}"; do [ -s "$(marker "$i")" ] || return 1; done
  [ $meta = no ] || { have_operator_base && have_manifests; }
}

if have_all; then
  echo "$dir"
  exit 0
fi

log() { echo "[node-images] $*" >&2; }
die() { echo "[node-images] error: $*" >&2; exit 1; }
for c in go gcc mmdebstrap python3; do
  command -v $c >/dev/null || die "$c is required (mmdebstrap: apt-get install mmdebstrap)"
done
[ "$(id -u)" = 0 ] || die "mmdebstrap builds the Debian root filesystems as root"
tools=$("$here/registry-bins.sh" | tail -n1)
crane="$tools/crane"
mkdir -p "$dir/src" "$dir/bin" "$dir/layers" "$store" "$done_dir"
. "$here/cache-lock.sh"
cache_lock "$dir" node-images have_all "$dir"
start=$(date +%s)
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
gobuild() { nice -n 19 go "$@"; }
timed() { # name command...
  local name=$1 t0 t
  shift
  t0=$(date +%s)
  "$@"
  t=$(( $(date +%s) - t0 ))
  log "$name done in ${t}s"
  sed -i "/^$name /d" "$dir/build-seconds" 2>/dev/null || true
  echo "$name $t" >>"$dir/build-seconds"
}
# Reproducible layer tarball of a directory's content (the file capabilities
# need PAX headers, which would carry atime and ctime).
layer() { # tar-path dir
  tar -C "$2" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --xattrs --xattrs-include=security.capability -cf "$1.tmp" .
  mv "$1.tmp" "$1"
}

# --- the registry on loopback -------------------------------------------------
. "$here/local-registry.sh"
trap 'if [ -n "${regpid:-}" ]; then kill "$regpid" 2>/dev/null; wait "$regpid" 2>/dev/null || true; fi' EXIT
serve_registry "$tools/registry" "$store" "$dir"
log "registry on $reg, storage $store"

# push image-ref config-flags... -- layers...: layers on an empty base, then the
# config, for linux/amd64; records the digest.
push() {
  local image=$1 flags=() layers=()
  shift
  while [ "$1" != -- ]; do flags+=("$1"); shift; done
  shift
  for l in "$@"; do layers+=(-f "$l"); done
  local ref="$reg/$image"
  "$crane" append --insecure --oci-empty-base "${layers[@]}" -t "$ref" >/dev/null
  "$crane" mutate --insecure "$ref" --set-platform linux/amd64 "${flags[@]}" -t "$ref" >/dev/null
  local digest
  digest=$("$crane" digest --insecure "$ref")
  log "pushed $image@$digest"
  echo "$digest" >"$(marker "$image")"
}

# A Debian root filesystem as one layer tarball.
rootfs() { # tar-path packages [mmdebstrap options...]
  local tarball=$1 pkgs=$2
  shift 2
  [ -s "$tarball" ] && return 0
  log "mmdebstrap $DEBIAN_SUITE with $pkgs"
  SOURCE_DATE_EPOCH=0 nice -n 19 mmdebstrap --quiet --mode=root --variant=essential --format=tar \
    --include="$pkgs" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' --skip=output/dev \
    "$@" "$DEBIAN_SUITE" "$tarball.tmp" "$DEBIAN_MIRROR" >&2
  mv "$tarball.tmp" "$tarball"
}

# go_install binary ldflags package@version: $dir/bin/<binary> from the Go
# module proxy, once.
go_install() {
  [ -x "$dir/bin/$1" ] && return 0
  log "building $3"
  (cd "$dir/src" && GOBIN="$dir/bin" gobuild install -trimpath -ldflags "$2" "$3")
}

# --- Kubernetes binaries (agnhost, kube-proxy, the control plane) ---------------
# The wrapper-module trick of scripts/testenv-bins.sh: require k8s.io/kubernetes
# and replace each staging module with its published v0.x release. One
# module per release, in $dir/src/kubernetes-<version>.
k8s_src="$dir/src/kubernetes-$K8S_VERSION"
k8s_wrapper() { # [version], default $K8S_VERSION
  local version=${1:-$K8S_VERSION}
  local src="$dir/src/kubernetes-$version" staging="v0.${version#v1.}" gomod
  [ -s "$src/go.sum" ] && return 0
  mkdir -p "$src"
  gomod=$(cd "$src" && go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "module kube-on-kube.test/k8s-images"
    echo
    echo "go $(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')"
    echo
    echo "require k8s.io/kubernetes $version"
    echo
    grep -E '^\s*k8s.io/[a-z0-9-]+ => \./staging/' "$gomod" \
      | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
  } >"$src/go.mod"
  cat >"$src/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
GO
  (cd "$src" && go mod tidy >&2)
}
k8s_dir() { (cd "$k8s_src" && go list -m -f '{{.Dir}}' k8s.io/kubernetes); }

# --- pause --------------------------------------------------------------------
build_pause() { # version
  local v=$1 stage="$dir/src/pause-$1" src
  k8s_wrapper
  src=$(k8s_dir)/build/pause/linux/pause.c
  [ -f "$src" ] || die "no $src"
  rm -rf "$stage" && mkdir -p "$stage/root"
  log "building pause $v"
  gcc -Os -Wall -Werror -static -DVERSION="v$v-kube-on-kube" -o "$stage/root/pause" "$src"
  strip "$stage/root/pause"
  chmod 0755 "$stage/root/pause"
  layer "$dir/layers/pause-$v.tar" "$stage/root"
  push "registry.k8s.io/pause:$v" --entrypoint /pause --user 65535:65535 -- "$dir/layers/pause-$v.tar"
}

# --- agnhost ------------------------------------------------------------------
# agnhost_layer version: the agnhost program stamped with `version`, the
# certificates its porter serves and a coredns for the DNS specs, as one layer.
agnhost_layer() {
  local v=$1 stage="$dir/src/agnhost-$1" kdir
  k8s_wrapper
  kdir=$(k8s_dir)
  rm -rf "$stage" && mkdir -p "$stage/root/uploads"
  log "building agnhost $v"
  (cd "$k8s_src" && gobuild build -trimpath -ldflags "-s -w -X main.Version=$v" \
    -o "$stage/root/agnhost" k8s.io/kubernetes/test/images/agnhost)
  ln -s agnhost "$stage/root/agnhost-2"
  cp "$kdir/test/images/agnhost/porter/localhost.crt" "$kdir/test/images/agnhost/porter/localhost.key" "$stage/root/"
  chmod 0644 "$stage/root/localhost.crt" "$stage/root/localhost.key"
  # upstream's image carries a coredns for the DNS tests
  [ -x "$dir/bin/coredns" ] && cp "$dir/bin/coredns" "$stage/root/coredns"
  layer "$dir/layers/agnhost-$v.tar" "$stage/root"
}

push_agnhost() { # version
  push "registry.k8s.io/e2e-test-images/agnhost:$1" \
    --entrypoint /agnhost --cmd pause --exposed-ports 80/tcp,8080/tcp,8081/tcp,9376/tcp,5000/tcp \
    -- "$dir/layers/agnhost-base.tar" "$dir/layers/agnhost-$1.tar"
}

build_agnhost() {
  agnhost_layer "$AGNHOST_VERSION"
  # The users and group upstream's image defines for the SupplementalGroups test.
  rootfs "$dir/layers/agnhost-base.tar" bash,curl,ca-certificates,bind9-dnsutils,netcat-openbsd,iproute2,iperf \
    --customize-hook='echo "user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh" >>"$1/etc/passwd"' \
    --customize-hook='echo "user-defined-in-image:x:1000:" >>"$1/etc/group"' \
    --customize-hook='echo "group-defined-in-image:x:50000:user-defined-in-image" >>"$1/etc/group"' \
    --customize-hook='ln -sf /usr/bin/iperf "$1/usr/local/bin/iperf"'
  push_agnhost "$AGNHOST_VERSION"
}

# --- coredns ------------------------------------------------------------------
# Like upstream's: the static binary with cap_net_bind_service, CA certificates,
# non-root (65532, distroless' nonroot).
build_coredns() {
  local stage="$dir/src/coredns"
  rm -rf "$stage" && mkdir -p "$stage/root/etc/ssl/certs"
  go_install coredns "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" \
    "github.com/coredns/coredns@$COREDNS_VERSION"
  cp "$dir/bin/coredns" "$stage/root/coredns"
  command -v setcap >/dev/null && setcap cap_net_bind_service=+ep "$stage/root/coredns"
  [ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$stage/root/etc/ssl/certs/"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$stage/root/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$stage/root/etc/group"
  layer "$dir/layers/coredns-$COREDNS_VERSION.tar" "$stage/root"
  push "registry.k8s.io/coredns/coredns:$COREDNS_VERSION" --entrypoint /coredns --user 65532:65532 \
    --exposed-ports 53/tcp,53/udp -- "$dir/layers/coredns-$COREDNS_VERSION.tar"
}

# --- kube-proxy ---------------------------------------------------------------
# Upstream's is distroless-iptables: kube-proxy in /usr/local/bin with the
# iptables (legacy and nft), nftables, conntrack, ipset and kmod userspace.
# k8s_build name dir [version]: k8s.io/kubernetes/cmd/<name> of version
# (default $K8S_VERSION), its version stamped as a release build's, into
# dir/usr/local/bin.
k8s_build() {
  local version=${3:-$K8S_VERSION}
  local pkg=k8s.io/component-base/version cg=k8s.io/client-go/pkg/version
  local minor=${version#v1.}; minor=${minor%%.*}
  local ld="-s -w" p
  for p in $pkg $cg; do
    ld="$ld -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld="$ld -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z -X $p.gitCommit=0000000000000000000000000000000000000000"
  done
  k8s_wrapper "$version"
  rm -rf "$2" && mkdir -p "$2/usr/local/bin"
  log "building $1 $version"
  (cd "$dir/src/kubernetes-$version" && gobuild build -trimpath -ldflags "$ld" -o "$2/usr/local/bin/$1" "k8s.io/kubernetes/cmd/$1")
}
build_kube_proxy() {
  local stage="$dir/src/kube-proxy"
  k8s_build kube-proxy "$stage/root"
  layer "$dir/layers/kube-proxy-$K8S_VERSION.tar" "$stage/root"
  rootfs "$dir/layers/kube-proxy-base.tar" iptables,nftables,conntrack,ipset,kmod
  push "registry.k8s.io/kube-proxy:$K8S_VERSION" \
    -- "$dir/layers/kube-proxy-base.tar" "$dir/layers/kube-proxy-$K8S_VERSION.tar"
}

# --- the control plane (--kubeadm, --meta) ----------------------------------------
# Upstream's are distroless: the static binary in /usr/local/bin, which
# kubeadm's static Pods and the operator's Deployments run by name.
build_control_plane() { # name version
  local stage="$dir/src/$1-$2"
  k8s_build "$1" "$stage/root" "$2"
  layer "$dir/layers/$1-$2.tar" "$stage/root"
  push "registry.k8s.io/$1:$2" --env PATH=/usr/local/bin:/usr/bin:/bin \
    -- "$dir/layers/$1-$2.tar"
}

# --- kube-router ----------------------------------------------------------------
# Upstream's Dockerfile: the static binary (CGO_ENABLED=0, the version and
# build date in pkg/version) in /usr/local/bin on a distribution with
# iptables, ipset, iproute2 (`ip` for tunnels and policy routing), kmod
# (`modprobe br_netfilter`), conntrack and a shell for the DaemonSet's
# install-cni init container. Left out: the gobgp CLI (a debugging tool) and
# the CNI plugins and cni-install script upstream bundles (the node-operator
# installs the CNI plugins; the init container runs cni-install only when
# present).
build_kube_router() {
  local stage="$dir/src/kube-router" pkg=github.com/cloudnativelabs/kube-router/v2/pkg/version
  rm -rf "$stage" && mkdir -p "$stage/root/usr/local/bin" "$stage/root/var/lib/gobgp"
  go_install kube-router "-s -w -X $pkg.Version=$KUBE_ROUTER_VERSION -X $pkg.BuildDate=1970-01-01T00:00:00Z" \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"
  cp "$dir/bin/kube-router" "$stage/root/usr/local/bin/kube-router"
  layer "$dir/layers/kube-router-$KUBE_ROUTER_VERSION.tar" "$stage/root"
  rootfs "$dir/layers/kube-router-base.tar" iptables,ipset,iproute2,kmod,conntrack
  push "docker.io/cloudnativelabs/kube-router:$KUBE_ROUTER_VERSION" \
    --entrypoint /usr/local/bin/kube-router --workdir /root \
    -- "$dir/layers/kube-router-base.tar" "$dir/layers/kube-router-$KUBE_ROUTER_VERSION.tar"
}

# --- metrics-server -------------------------------------------------------------
# Upstream's: the static binary as /metrics-server on distroless static, run
# as nobody (65534, its Dockerfile); it writes its self-signed serving certificate to
# --cert-dir (the template's /tmp, an emptyDir).
build_metrics_server() {
  local stage="$dir/src/metrics-server" pkg=k8s.io/client-go/pkg/version
  rm -rf "$stage" && mkdir -p "$stage/root/etc/ssl/certs" "$stage/root/tmp"
  chmod 1777 "$stage/root/tmp"
  go_install metrics-server "-s -w -X $pkg.gitVersion=$METRICS_SERVER_VERSION -X $pkg.gitCommit=0000000000000000000000000000000000000000 -X $pkg.buildDate=1970-01-01T00:00:00Z" \
    "sigs.k8s.io/metrics-server/cmd/metrics-server@$METRICS_SERVER_VERSION"
  cp "$dir/bin/metrics-server" "$stage/root/metrics-server"
  [ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$stage/root/etc/ssl/certs/"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$stage/root/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$stage/root/etc/group"
  layer "$dir/layers/metrics-server-$METRICS_SERVER_VERSION.tar" "$stage/root"
  push "registry.k8s.io/metrics-server/metrics-server:$METRICS_SERVER_VERSION" \
    --entrypoint /metrics-server --user 65534:65534 --exposed-ports 10250/tcp \
    -- "$dir/layers/metrics-server-$METRICS_SERVER_VERSION.tar"
}

# --- konnectivity: proxy-agent, proxy-server (--meta) -----------------------------
# Upstream's: the static binary as /proxy-<program> on distroless static. The
# proxy's version list is not served, so `go install pkg@version` (which asks
# for it) cannot build it: a module of its own requires the exact version.
# The server runs as upstream's, as distroless' nonroot user (65532), so the
# operator's kube-apiserver Pods meet what they would with upstream's image;
# the agent's image runs as root (upstream's is nonroot too).
build_konnectivity() { # agent|server
  local program="proxy-$1" stage="$dir/src/proxy-$1" src="$dir/src/konnectivity-$KONNECTIVITY_VERSION"
  local user=()
  [ "$1" = server ] && user=(--user 65532:65532)
  rm -rf "$stage" && mkdir -p "$stage/root/etc" "$src"
  [ -s "$src/go.mod" ] || printf 'module kube-on-kube.test/konnectivity\n\ngo %s\n' \
    "$(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')" >"$src/go.mod"
  (cd "$src" && go get "sigs.k8s.io/apiserver-network-proxy@$KONNECTIVITY_VERSION" >&2 \
    && gobuild build -trimpath -ldflags "-s -w" -o "$stage/root/$program" "sigs.k8s.io/apiserver-network-proxy/cmd/$1")
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' >"$stage/root/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' >"$stage/root/etc/group"
  if [ "$1" = server ]; then
    echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >>"$stage/root/etc/passwd"
    echo 'nonroot:x:65532:' >>"$stage/root/etc/group"
  fi
  layer "$dir/layers/$program-$KONNECTIVITY_VERSION.tar" "$stage/root"
  push "registry.k8s.io/kas-network-proxy/$program:$KONNECTIVITY_VERSION" \
    --entrypoint "/$program" "${user[@]}" -- "$dir/layers/$program-$KONNECTIVITY_VERSION.tar"
}

# --- the conformance suite's images (--e2e) -------------------------------------
# busybox as upstream's image has it (busybox:1.37.0, a defconfig build):
# upstream's source (Debian's pristine .orig tarball of the release, checked
# against its sha256), configured with defconfig and linked statically, every
# applet a link in /bin, the users and directories the suite's commands
# expect. Debian's own busybox-static drops environment variables whose names
# are no shell identifiers (`data-1`), which upstream's sh passes on to its
# children and the suite's Secret and ConfigMap specs read with `sh -c env`.
build_busybox() {
  local stage="$dir/src/busybox" src="$dir/src/busybox-$BUSYBOX_VERSION" a
  local tarball="$dir/src/busybox_$BUSYBOX_VERSION.orig.tar.bz2"
  rm -rf "$stage" && mkdir -p "$stage/root/bin" "$stage/root/etc" "$stage/root/tmp" \
    "$stage/root/root" "$stage/root/home" "$stage/root/var/www" "$stage/root/usr/bin" "$stage/root/usr/sbin"
  chmod 1777 "$stage/root/tmp"
  if ! echo "$BUSYBOX_SHA256  $tarball" | sha256sum -c --quiet >/dev/null 2>&1; then
    log "downloading busybox $BUSYBOX_VERSION's source"
    curl -fsS -o "$tarball.tmp" "$DEBIAN_MIRROR/pool/main/b/busybox/busybox_$BUSYBOX_VERSION.orig.tar.bz2"
    echo "$BUSYBOX_SHA256  $tarball.tmp" | sha256sum -c --quiet || die "busybox source: sha256 mismatch"
    mv "$tarball.tmp" "$tarball"
  fi
  rm -rf "$src" && tar -xjf "$tarball" -C "$dir/src"
  log "building busybox $BUSYBOX_VERSION"
  (
    cd "$src"
    make defconfig >/dev/null
    # Static like upstream's image; tc does not build against current kernel
    # headers (CBQ is gone) and no spec runs it.
    sed -i 's/^# CONFIG_STATIC is not set/CONFIG_STATIC=y/; s/^CONFIG_TC=y/# CONFIG_TC is not set/' .config
    nice -n 19 make -j"$(nproc)" busybox >&2
  )
  cp "$src/busybox" "$stage/root/bin/busybox"
  for a in $("$stage/root/bin/busybox" --list); do
    [ "$a" = busybox ] || ln -sf busybox "$stage/root/bin/$a"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\ndaemon:x:1:1:daemon:/usr/sbin:/bin/false\nnobody:x:65534:65534:nobody:/home:/bin/false\n' >"$stage/root/etc/passwd"
  printf 'root:x:0:\ndaemon:x:1:\nnogroup:x:65534:\n' >"$stage/root/etc/group"
  layer "$dir/layers/busybox-$BUSYBOX_TAG.tar" "$stage/root"
  push "registry.k8s.io/e2e-test-images/busybox:$BUSYBOX_TAG" --cmd sh \
    -- "$dir/layers/busybox-$BUSYBOX_TAG.tar"
  touch "$busybox_stamp"
}

# nginx serving its default page on port 80, logging to the container's
# output, stopped gracefully by SIGQUIT as upstream's.
build_nginx() {
  rootfs "$dir/layers/nginx-base.tar" nginx \
    --customize-hook='mkdir -p "$1/var/log/nginx" && ln -sf /dev/stdout "$1/var/log/nginx/access.log"' \
    --customize-hook='ln -sf /dev/stderr "$1/var/log/nginx/error.log"'
  push "registry.k8s.io/e2e-test-images/nginx:$NGINX_TAG" \
    --entrypoint nginx --cmd=-g,"daemon off;" --exposed-ports 80/tcp \
    -- "$dir/layers/nginx-base.tar"
}

build_dnsutils() {
  rootfs "$dir/layers/dnsutils-base.tar" bind9-dnsutils,bind9-host,iputils-ping
  push "registry.k8s.io/e2e-test-images/jessie-dnsutils:$DNSUTILS_TAG" \
    -- "$dir/layers/dnsutils-base.tar"
}

# The suite's previous agnhost: the same source as agnhost:$AGNHOST_VERSION,
# its version stamped $AGNHOST_PREV_VERSION, so an update between the two is
# a real change of image.
build_agnhost_prev() {
  [ -s "$dir/layers/agnhost-base.tar" ] || die "agnhost:$AGNHOST_VERSION first"
  agnhost_layer "$AGNHOST_PREV_VERSION"
  push_agnhost "$AGNHOST_PREV_VERSION"
}

# nginx:1.15-4: the same server, a layer of its own naming the tag.
build_nginx_new() {
  local stage="$dir/src/nginx-new"
  rm -rf "$stage" && mkdir -p "$stage/root/etc"
  echo "$NGINX_NEW_TAG" >"$stage/root/etc/e2e-image-tag"
  layer "$dir/layers/nginx-new.tar" "$stage/root"
  push "registry.k8s.io/e2e-test-images/nginx:$NGINX_NEW_TAG" \
    --entrypoint nginx --cmd=-g,"daemon off;" --exposed-ports 80/tcp \
    -- "$dir/layers/nginx-base.tar" "$dir/layers/nginx-new.tar"
}

# kitten and nautilus as upstream's Dockerfiles make them: agnhost with the
# picture and data.json at /, running test-webserver (which serves /).
build_pet() { # kitten|nautilus
  local pet=$1 stage="$dir/src/$1" kdir
  k8s_wrapper
  kdir=$(k8s_dir)
  rm -rf "$stage" && mkdir -p "$stage/root"
  cp "$kdir/test/images/$pet/html/$pet.jpg" "$kdir/test/images/$pet/html/data.json" "$stage/root/"
  chmod 0644 "$stage/root/"*
  layer "$dir/layers/$pet-$KITTEN_TAG.tar" "$stage/root"
  push "registry.k8s.io/e2e-test-images/$pet:$KITTEN_TAG" \
    --entrypoint /agnhost --cmd test-webserver --exposed-ports 80/tcp \
    -- "$dir/layers/agnhost-base.tar" "$dir/layers/agnhost-$AGNHOST_VERSION.tar" "$dir/layers/$pet-$KITTEN_TAG.tar"
}

# The sample API server of the pinned release's staging modules (upstream's
# image is the same program, /sample-apiserver, of an older release).
build_sample_apiserver() {
  local stage="$dir/src/sample-apiserver" src="$dir/src/sample-apiserver-mod"
  local staging="v0.${K8S_VERSION#v1.}"
  rm -rf "$stage" && mkdir -p "$stage/root/tmp" "$src"
  chmod 1777 "$stage/root/tmp"
  [ -s "$src/go.mod" ] || printf 'module kube-on-kube.test/sample-apiserver\n\ngo %s\n' \
    "$(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')" >"$src/go.mod"
  (cd "$src" && go get "k8s.io/sample-apiserver@$staging" >&2 \
    && gobuild build -trimpath -ldflags "-s -w" -o "$stage/root/sample-apiserver" k8s.io/sample-apiserver)
  layer "$dir/layers/sample-apiserver-$SAMPLE_APISERVER_TAG.tar" "$stage/root"
  push "registry.k8s.io/e2e-test-images/sample-apiserver:$SAMPLE_APISERVER_TAG" \
    --entrypoint /sample-apiserver -- "$dir/layers/sample-apiserver-$SAMPLE_APISERVER_TAG.tar"
}

# etcd as upstream's image has it: etcd, etcdctl and etcdutl in
# /usr/local/bin, on PATH as distroless sets it. Left out: the bash upstream
# copies to /bin/sh and its migrate tools, for kube-up's manifests; kubeadm's
# and the operator's Pods run etcd and etcdutl by name. etcd's modules carry
# replace directives, which `go install` refuses: one-line mains in a module
# of our own. etcdutl's own main is in its module's root package, which
# cannot be imported: the same commands on a root command of our own (as
# scripts/backup-bins.sh builds it).
build_etcd() { # version
  local v=$1 stage="$dir/src/etcd-image-$1" src="$dir/src/etcd-$1" c
  rm -rf "$stage" && mkdir -p "$stage/root/usr/local/bin" "$stage/root/var/etcd" \
    "$src/etcd" "$src/etcdctl" "$src/etcdutl"
  cat >"$src/go.mod" <<GOMOD
module kube-on-kube.test/etcd-image

go $(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')

require (
	go.etcd.io/etcd/server/v3 v$v
	go.etcd.io/etcd/etcdctl/v3 v$v
	go.etcd.io/etcd/etcdutl/v3 v$v
)
GOMOD
  printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' >"$src/etcd/main.go"
  printf 'package main\n\nimport "go.etcd.io/etcd/etcdctl/v3/ctlv3"\n\nfunc main() { ctlv3.MustStart() }\n' >"$src/etcdctl/main.go"
  cat >"$src/etcdutl/main.go" <<'GO'
package main

import (
	"os"

	"github.com/spf13/cobra"

	"go.etcd.io/etcd/etcdutl/v3/etcdutl"
)

func main() {
	root := &cobra.Command{Use: "etcdutl", Short: "An administrative command line tool for etcd3."}
	root.PersistentFlags().StringVarP(&etcdutl.OutputFormat, "write-out", "w", "simple",
		"set the output format (fields, json, protobuf, simple, table)")
	root.AddCommand(
		etcdutl.NewDefragCommand(),
		etcdutl.NewSnapshotCommand(),
		etcdutl.NewHashKVCommand(),
		etcdutl.NewVersionCommand(),
		etcdutl.NewMigrateCommand(),
	)
	if root.Execute() != nil {
		os.Exit(1)
	}
}
GO
  log "building etcd, etcdctl and etcdutl $v"
  (cd "$src" && go mod tidy >&2)
  for c in etcd etcdctl etcdutl; do
    (cd "$src" && gobuild build -trimpath -ldflags "-s -w" -o "$stage/root/usr/local/bin/$c" "./$c")
  done
  layer "$dir/layers/etcd-$v.tar" "$stage/root"
  push "registry.k8s.io/etcd:$v-0" --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /usr/local/bin/etcd -- "$dir/layers/etcd-$v.tar"
}

# --- the operator's own Pods (--meta) --------------------------------------------
# versitygw, the snapshot gateway: upstream's image (its Dockerfile) has the
# binary as /usr/local/bin/versitygw on alpine, started by a shell entrypoint
# that runs it with the container's arguments when there are any. The
# operator's gateway Pod always passes them (and sets its user, 65532), so
# here the binary is the entrypoint itself and no shell is needed. Built as
# scripts/backup-bins.sh builds it.
build_versitygw() {
  local stage="$dir/src/versitygw"
  rm -rf "$stage" && mkdir -p "$stage/root/usr/local/bin" "$stage/root/tmp/vgw"
  chmod 1777 "$stage/root/tmp"
  go_install versitygw "-s -w -X main.Version=$VERSITYGW_VERSION" \
    "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION"
  cp "$dir/bin/versitygw" "$stage/root/usr/local/bin/versitygw"
  layer "$dir/layers/versitygw-$VERSITYGW_VERSION.tar" "$stage/root"
  push "ghcr.io/versity/versitygw:$VERSITYGW_VERSION" \
    --entrypoint /usr/local/bin/versitygw --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    -- "$dir/layers/versitygw-$VERSITYGW_VERSION.tar"
}

# The operators' base: Debian with the ssh client the node-operator runs
# (openssh drives `ssh` with a control socket) and the CA certificates S3
# endpoints are checked against, and distroless' nonroot user, whose home and
# passwd entry ssh looks up. scripts/operator-images.sh adds the binaries.
build_operator_base() {
  rootfs "$dir/layers/operator-base.tar" openssh-client,ca-certificates \
    --customize-hook='echo "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin" >>"$1/etc/passwd"' \
    --customize-hook='echo "nonroot:x:65532:" >>"$1/etc/group"' \
    --customize-hook='mkdir -p "$1/home/nonroot" && chown 65532:65532 "$1/home/nonroot" && chmod 0700 "$1/home/nonroot"'
  push "$OPERATOR_BASE" --user 65532:65532 --workdir /home/nonroot \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    -- "$dir/layers/operator-base.tar"
  rm -rf "$dir/operator-base.oci" "$dir/operator-base.oci.tmp"
  "$crane" pull --insecure --format=oci "$reg/$OPERATOR_BASE" "$dir/operator-base.oci.tmp"
  mv "$dir/operator-base.oci.tmp" "$dir/operator-base.oci"
}

# nonewprivs as upstream's Dockerfile makes it: nnp (it prints its effective
# user ID) as /usr/local/bin/nnp, owned by root and set-user-ID, so a
# container that may not gain privileges runs it as its own user.
build_nonewprivs() {
  local stage="$dir/src/nonewprivs" kdir
  k8s_wrapper
  kdir=$(k8s_dir)
  rm -rf "$stage" && mkdir -p "$stage/root/usr/local/bin"
  (cd "$k8s_src" && gobuild build -trimpath -ldflags "-s -w" -o "$stage/root/usr/local/bin/nnp" \
    "$kdir/test/images/nonewprivs/nnp.go")
  chmod 4755 "$stage/root/usr/local/bin/nnp"
  layer "$dir/layers/nonewprivs-$NONEWPRIVS_TAG.tar" "$stage/root"
  push "registry.k8s.io/e2e-test-images/nonewprivs:$NONEWPRIVS_TAG" --cmd nnp \
    -- "$dir/layers/nonewprivs-$NONEWPRIVS_TAG.tar"
}

# --- the meta-cluster's claims and load balancer (--meta) ------------------------
# A program of a Go module, built in a wrapper module of its own
# ($dir/src/<name>): the module's own replace directives do not apply.
go_program() { # name module@version package output
  local src="$dir/src/$1"
  mkdir -p "$src"
  [ -s "$src/go.mod" ] || printf 'module kube-on-kube.test/%s\n\ngo %s\n' "$1" \
    "$(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')" >"$src/go.mod"
  (cd "$src" && go get "$2" >&2 && gobuild build -trimpath -ldflags "-s -w" -o "$4" "$3")
}
# Upstream's image is Alpine with the binary as /usr/bin/local-path-provisioner;
# the Deployment names the program, so the binary alone does.
build_local_path() {
  local stage="$dir/src/local-path-image"
  rm -rf "$stage" && mkdir -p "$stage/root/usr/bin"
  go_program local-path-provisioner "github.com/rancher/local-path-provisioner@$LOCAL_PATH_VERSION" \
    github.com/rancher/local-path-provisioner "$stage/root/usr/bin/local-path-provisioner"
  layer "$dir/layers/local-path-provisioner-$LOCAL_PATH_VERSION.tar" "$stage/root"
  push "docker.io/rancher/local-path-provisioner:$LOCAL_PATH_VERSION" --env PATH=/usr/bin:/bin \
    --cmd local-path-provisioner -- "$dir/layers/local-path-provisioner-$LOCAL_PATH_VERSION.tar"
}
# Upstream's images are distroless with /<component> as the entrypoint.
build_metallb() { # controller|speaker
  local stage="$dir/src/metallb-$1-image"
  rm -rf "$stage" && mkdir -p "$stage/root"
  go_program metallb "go.universe.tf/metallb@$METALLB_VERSION" "go.universe.tf/metallb/$1" "$stage/root/$1"
  layer "$dir/layers/metallb-$1-$METALLB_VERSION.tar" "$stage/root"
  push "quay.io/metallb/$1:$METALLB_VERSION" --entrypoint "/$1" \
    -- "$dir/layers/metallb-$1-$METALLB_VERSION.tar"
}
# Upstream's manifests, from the modules' sources as released.
meta_manifests() {
  local lp mlb
  lp=$(cd "$dir/src/local-path-provisioner" && go list -m -f '{{.Dir}}' github.com/rancher/local-path-provisioner)
  mlb=$(cd "$dir/src/metallb" && go list -m -f '{{.Dir}}' go.universe.tf/metallb)
  mkdir -p "$dir/manifests"
  cp "$lp/deploy/local-path-storage.yaml" "$dir/manifests/local-path-storage.yaml.tmp"
  cp "$mlb/config/manifests/metallb-native.yaml" "$dir/manifests/metallb-native.yaml.tmp"
  chmod 0644 "$dir/manifests/"*.tmp
  mv "$dir/manifests/local-path-storage.yaml.tmp" "$dir/manifests/local-path-storage.yaml"
  mv "$dir/manifests/metallb-native.yaml.tmp" "$dir/manifests/metallb-native.yaml"
}

for v in $PAUSE_VERSIONS; do
  [ -s "$(marker "registry.k8s.io/pause:$v")" ] || timed "pause-$v" build_pause "$v"
done
[ -s "$(marker "registry.k8s.io/coredns/coredns:$COREDNS_VERSION")" ] || timed coredns build_coredns
[ -s "$(marker "registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION")" ] || timed agnhost build_agnhost
[ -s "$(marker "registry.k8s.io/kube-proxy:$K8S_VERSION")" ] || timed kube-proxy build_kube_proxy
[ -s "$(marker "docker.io/cloudnativelabs/kube-router:$KUBE_ROUTER_VERSION")" ] || timed kube-router build_kube_router
[ -s "$(marker "registry.k8s.io/metrics-server/metrics-server:$METRICS_SERVER_VERSION")" ] || timed metrics-server build_metrics_server
[ -s "$(marker "registry.k8s.io/kas-network-proxy/proxy-agent:$KONNECTIVITY_VERSION")" ] || timed proxy-agent build_konnectivity agent
if [ $e2e = yes ]; then
  [ -s "$(marker "registry.k8s.io/e2e-test-images/busybox:$BUSYBOX_TAG")" ] || timed busybox build_busybox
  [ -s "$(marker "registry.k8s.io/e2e-test-images/nginx:$NGINX_TAG")" ] || timed nginx build_nginx
  [ -s "$(marker "registry.k8s.io/e2e-test-images/jessie-dnsutils:$DNSUTILS_TAG")" ] || timed jessie-dnsutils build_dnsutils
  [ -s "$(marker "registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_PREV_VERSION")" ] || timed agnhost-prev build_agnhost_prev
  [ -s "$(marker "registry.k8s.io/e2e-test-images/nginx:$NGINX_NEW_TAG")" ] || timed nginx-new build_nginx_new
  for pet in kitten nautilus; do
    [ -s "$(marker "registry.k8s.io/e2e-test-images/$pet:$KITTEN_TAG")" ] || timed "$pet" build_pet "$pet"
  done
  [ -s "$(marker "registry.k8s.io/e2e-test-images/sample-apiserver:$SAMPLE_APISERVER_TAG")" ] || timed sample-apiserver build_sample_apiserver
  [ -s "$(marker "registry.k8s.io/etcd:$E2E_ETCD_VERSION-0")" ] || timed etcd build_etcd "$E2E_ETCD_VERSION"
  [ -s "$(marker "registry.k8s.io/e2e-test-images/nonewprivs:$NONEWPRIVS_TAG")" ] || timed nonewprivs build_nonewprivs
fi

if [ $kubeadm = yes ]; then
  for b in "${CONTROL_PLANE[@]}"; do
    [ -s "$(marker "registry.k8s.io/$b:$K8S_VERSION")" ] || timed "$b" build_control_plane "$b" "$K8S_VERSION"
  done
  [ -s "$(marker "registry.k8s.io/etcd:$E2E_ETCD_VERSION-0")" ] || timed etcd build_etcd "$E2E_ETCD_VERSION"
fi

if [ $meta = yes ]; then
  for v in "$K8S_VERSION" "$K8S_FROM_VERSION"; do
    for b in "${CONTROL_PLANE[@]}"; do
      [ -s "$(marker "registry.k8s.io/$b:$v")" ] || timed "$b-$v" build_control_plane "$b" "$v"
    done
  done
  for v in "$ETCD_VERSION" "$ETCD_FROM_VERSION"; do
    [ -s "$(marker "registry.k8s.io/etcd:$v-0")" ] || timed "etcd-$v" build_etcd "$v"
  done
  [ -s "$(marker "registry.k8s.io/kas-network-proxy/proxy-server:$KONNECTIVITY_VERSION")" ] || timed proxy-server build_konnectivity server
  [ -s "$(marker "ghcr.io/versity/versitygw:$VERSITYGW_VERSION")" ] || timed versitygw build_versitygw
  [ -s "$(marker "docker.io/rancher/local-path-provisioner:$LOCAL_PATH_VERSION")" ] || timed local-path-provisioner build_local_path
  for c in controller speaker; do
    [ -s "$(marker "quay.io/metallb/$c:$METALLB_VERSION")" ] || timed "metallb-$c" build_metallb "$c"
  done
  have_manifests || meta_manifests
  have_operator_base || timed operator-base build_operator_base
fi

have_all || die "some images are missing"
for i in "${wanted[@]}"; do echo "$i@$(cat "$(marker "$i")")"; done | awk '!seen[$0]++' >"$dir/images.txt"
took=$(( $(date +%s) - start ))
log "built in ${took}s; $(du -sh "$store" | cut -f1) in $store"
echo "$dir"
