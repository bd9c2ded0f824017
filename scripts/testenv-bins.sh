#!/usr/bin/env bash
# Builds the upstream binaries the test environment runs (kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kubectl, etcd, etcdctl, kwok,
# helm, and konnectivity's proxy-server that runs beside each business
# kube-apiserver) from their Go modules and caches them outside the repository. The
# previous patch releases of the control plane and etcd are built too, under
# versioned names (kube-apiserver-v1.35.3, etcd-v3.6.15, …), so that upgrades
# can be tested from one real release to the next. With --kubelet-next it also
# builds the kubelet's next patch release (kubelet-v1.35.8), the version worker
# nodes are upgraded to; scripts/node-artifacts.sh asks for it. With --e2e it
# also builds the upstream end-to-end suite of the pinned release (e2e.test,
# `go test -c k8s.io/kubernetes/test/e2e` through the same wrapper module) and
# the ginkgo CLI of the version that release requires, which runs it in
# parallel as Sonobuoy does. With --kubeadm it also builds kubeadm of the pinned
# release, which `kok-bench cluster` runs as the peer of a Cluster with nodes.
# It also builds this repository's KMS v2 plugin for the tests
# (tools/kms-plugin, on k8s.io/kms), again whenever its sources change.
#
# Idempotent: when every binary for the pinned versions is already in the cache,
# it prints the directory and exits without building.
#
#   scripts/testenv-bins.sh          # build if needed, print the bin directory
#   scripts/testenv-bins.sh --kubelet-next   # also the next kubelet release
#   scripts/testenv-bins.sh --e2e            # also e2e.test and ginkgo
#   scripts/testenv-bins.sh --kubeadm        # also kubeadm (the cluster benchmark's peer)
#   KOK_TESTENV_DIR=/some/dir scripts/testenv-bins.sh
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.35.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.7.0}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
# The version of konnectivity (sigs.k8s.io/apiserver-network-proxy) the
# operator's kube-apiserver Pods and konnectivity-agent add-on use.
KONNECTIVITY_VERSION=${KONNECTIVITY_VERSION:-v0.34.0}
# Releases an upgrade test starts from.
K8S_FROM_VERSION=${K8S_FROM_VERSION:-v1.35.3}
ETCD_FROM_VERSION=${ETCD_FROM_VERSION:-v3.6.15}
# The kubelet release worker nodes upgrade to (a kubelet may be newer than the
# API server by patch releases only).
KUBELET_NEXT_VERSION=${KUBELET_NEXT_VERSION:-v1.35.8}

root=${KOK_TESTENV_DIR:-$HOME/.cache/kube-on-kube}
dir="$root/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION"
bin="$dir/bin"
wanted=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl etcd etcdctl kwok helm proxy-server
  "kube-apiserver-$K8S_FROM_VERSION" "kube-controller-manager-$K8S_FROM_VERSION"
  "kube-scheduler-$K8S_FROM_VERSION" "etcd-$ETCD_FROM_VERSION")
kubelet_next=no
e2e=no
kubeadm=no
for arg in "$@"; do
  case $arg in
    --kubelet-next) kubelet_next=yes; wanted+=("kubelet-$KUBELET_NEXT_VERSION") ;;
    --e2e) e2e=yes; wanted+=(e2e.test ginkgo) ;;
    --kubeadm) kubeadm=yes; wanted+=(kubeadm) ;;
    *) echo "unknown argument $arg (--kubelet-next, --e2e, --kubeadm)" >&2; exit 2 ;;
  esac
done

# The tests' KMS v2 plugin, a program of this repository: built again when
# its sources change (their hash beside it).
kms_src="$(cd "$(dirname "$0")/.." && pwd)/tools/kms-plugin"
kms_stamp=$(cat "$kms_src/go.mod" "$kms_src/go.sum" "$kms_src"/*.go | sha256sum | cut -c1-16)
kms_built() { [ -x "$bin/kms-plugin" ] && [ "$(cat "$bin/kms-plugin.source" 2>/dev/null)" = "$kms_stamp" ]; }

have_all() {
  local b
  for b in "${wanted[@]}"; do [ -x "$bin/$b" ] || return 1; done
  kms_built
}

if have_all; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "go is required to build the test binaries" >&2; exit 1; }
mkdir -p "$bin" "$dir/src"
# One build at a time per cache directory: scripts/node-software.sh asks for
# --kubelet-next and --e2e while scripts/test.sh or CI may ask for the rest.
# shellcheck source=cache-lock.sh
. "$(dirname "$0")/cache-lock.sh"
cache_lock "$dir" testenv-bins have_all "$bin"
start=$(date +%s)
log() { echo "[testenv-bins] $*" >&2; }
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

# --- Kubernetes -------------------------------------------------------------
# wrapper_module version dir module-name: a go.mod in dir that requires
# k8s.io/kubernetes@version and replaces each of its staging modules with the
# published v0.x release of the same patch.
wrapper_module() {
  local version=$1 src=$2 name=$3 staging="v0.${1#v1.}" gomod
  mkdir -p "$src"
  log "reading the staging module list of k8s.io/kubernetes@$version"
  gomod=$(cd "$src" && go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "module $name"
    echo
    echo "go $(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')"
    echo
    echo "require k8s.io/kubernetes $version"
    echo
    grep -E '^\s*k8s.io/[a-z0-9-]+ => \./staging/' "$gomod" \
      | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
  } >"$src/go.mod"
}

# k8s.io/kubernetes uses replace directives for its staging modules, which `go
# install` refuses. A wrapper module requires it and replaces every staging module
# with its published v0.x release of the same patch.
build_kubernetes() { # version suffix commands...
  local version=$1 suffix=$2 need=0 b
  shift 2
  for b in "$@"; do
    [ -x "$bin/$b$suffix" ] || need=1
  done
  [ $need = 1 ] || return 0
  local src="$dir/src/kubernetes-$version"
  wrapper_module "$version" "$src" kube-on-kube.test/k8s-bins
  cat >"$src/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubeadm"
)
GO
  (cd "$src" && go mod tidy >&2)
  local pkg=k8s.io/component-base/version cg=k8s.io/client-go/pkg/version
  local minor=${version#v1.}; minor=${minor%%.*}
  local date; date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local ld="-s -w"
  for p in $pkg $cg; do
    ld="$ld -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld="$ld -X $p.gitTreeState=clean -X $p.buildDate=$date -X $p.gitCommit=0000000000000000000000000000000000000000"
  done
  for b in "$@"; do
    [ -x "$bin/$b$suffix" ] && continue
    log "building $b $version"
    (cd "$src" && go build -trimpath -ldflags "$ld" -o "$bin/$b$suffix.tmp" "k8s.io/kubernetes/cmd/$b" && mv "$bin/$b$suffix.tmp" "$bin/$b$suffix")
  done
}

# --- etcd -------------------------------------------------------------------
# etcd's own go.mod has replace directives too: one-line mains in a wrapper.
build_etcd() { # version suffix with-etcdctl
  local version=$1 suffix=$2 ctl=$3
  [ -x "$bin/etcd$suffix" ] && { [ "$ctl" = no ] || [ -x "$bin/etcdctl" ]; } && return 0
  local src="$dir/src/etcd-$version"
  mkdir -p "$src/etcd" "$src/etcdctl"
  cat >"$src/go.mod" <<GOMOD
module kube-on-kube.test/etcd-bins

go $(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')

require (
	go.etcd.io/etcd/server/v3 $version
	go.etcd.io/etcd/etcdctl/v3 $version
)
GOMOD
  cat >"$src/etcd/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  cat >"$src/etcdctl/main.go" <<'GO'
package main

import "go.etcd.io/etcd/etcdctl/v3/ctlv3"

func main() { ctlv3.MustStart() }
GO
  (cd "$src" && go mod tidy >&2)
  log "building etcd $version"
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd$suffix" ./etcd)
  if [ "$ctl" = yes ]; then
    log "building etcdctl $version"
    (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$bin/etcdctl" ./etcdctl)
  fi
}

# --- the e2e suite ------------------------------------------------------------
# e2e.test of the pinned release, unmodified, and the ginkgo CLI at the version
# its go.mod requires. Version information as the release's own build sets it
# (the suite reports it and compares it with the server's).
build_e2e() { # version
  local version=$1 src="$dir/src/e2e-$1"
  if [ ! -x "$bin/e2e.test" ]; then
    wrapper_module "$version" "$src" kube-on-kube.test/k8s-e2e
    cat >"$src/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/test/e2e"
)
GO
    (cd "$src" && go mod tidy >&2)
    local pkg=k8s.io/component-base/version cg=k8s.io/client-go/pkg/version p
    local minor=${version#v1.}; minor=${minor%%.*}
    local ld="-s -w"
    for p in $pkg $cg; do
      ld="$ld -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
      ld="$ld -X $p.gitTreeState=clean -X $p.gitCommit=0000000000000000000000000000000000000000"
    done
    log "building e2e.test $version"
    (cd "$src" && go test -c -trimpath -ldflags "$ld" -o "$bin/e2e.test.tmp" k8s.io/kubernetes/test/e2e \
      && mv "$bin/e2e.test.tmp" "$bin/e2e.test")
  fi
  if [ ! -x "$bin/ginkgo" ]; then
    [ -f "$src/go.mod" ] || { echo "no $src/go.mod: remove $bin/e2e.test and run again" >&2; exit 1; }
    log "building ginkgo"
    (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$bin/ginkgo" github.com/onsi/ginkgo/v2/ginkgo)
  fi
}

build_install() { # name module-path version
  [ -x "$bin/$1" ] && return 0
  log "building $1 $3"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w" "$2@$3"
}

# build_in_module name module version package: a command of a module whose
# version list the proxy does not serve (so `go install pkg@version`, which
# asks for it, fails), built in a module of its own that requires that exact
# version. Konnectivity's proxy-server is one.
build_in_module() {
  [ -x "$bin/$1" ] && return 0
  log "building $1 $3"
  local src="$dir/src/$1-$3"
  mkdir -p "$src"
  [ -s "$src/go.mod" ] || printf 'module kube-on-kube.test/%s\n\ngo %s\n' "$1" \
    "$(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')" >"$src/go.mod"
  (cd "$src" && go get "$2@$3" && go build -trimpath -ldflags "-s -w" -o "$bin/$1.tmp" "$4" && mv "$bin/$1.tmp" "$bin/$1")
}

build_etcd "$ETCD_VERSION" "" yes
build_etcd "$ETCD_FROM_VERSION" "-$ETCD_FROM_VERSION" no
build_install kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION"
build_install helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION"
build_in_module proxy-server sigs.k8s.io/apiserver-network-proxy "$KONNECTIVITY_VERSION" sigs.k8s.io/apiserver-network-proxy/cmd/server
build_kubernetes "$K8S_VERSION" "" kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl
build_kubernetes "$K8S_FROM_VERSION" "-$K8S_FROM_VERSION" kube-apiserver kube-controller-manager kube-scheduler
[ $kubelet_next = no ] || build_kubernetes "$KUBELET_NEXT_VERSION" "-$KUBELET_NEXT_VERSION" kubelet
[ $e2e = no ] || build_e2e "$K8S_VERSION"
[ $kubeadm = no ] || build_kubernetes "$K8S_VERSION" "" kubeadm
if ! kms_built; then
  log "building kms-plugin (tools/kms-plugin)"
  (cd "$kms_src" && go build -trimpath -ldflags "-s -w" -o "$bin/kms-plugin.tmp" . && mv "$bin/kms-plugin.tmp" "$bin/kms-plugin")
  echo "$kms_stamp" >"$bin/kms-plugin.source"
fi

have_all || { echo "some binaries are missing in $bin" >&2; exit 1; }
took=$(( $(date +%s) - start ))
log "built in ${took}s; $(du -sh "$bin" | cut -f1) in $bin"
echo "$took" >"$dir/build-seconds"
echo "$bin"
