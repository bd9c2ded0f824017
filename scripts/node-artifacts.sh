#!/usr/bin/env bash
# Builds what a worker node installs — containerd (with its runc shim and ctr),
# runc, the CNI plugins, crictl and the kubelet — from their upstream Go modules
# and packs each the way its project releases it:
#
#   containerd-<v>-linux-amd64.tar.gz      bin/containerd, bin/containerd-shim-runc-v2, bin/ctr
#   runc.amd64                             the static binary
#   cni-plugins-linux-amd64-v<v>.tgz       ./bridge, ./host-local, … (flat)
#   crictl-v<v>-linux-amd64.tar.gz         crictl
#   kubelet                                the binary (built by scripts/testenv-bins.sh)
#   kubelet-v<next>                        the next patch release's binary, the
#                                          version worker nodes upgrade to
#   SHA256SUMS                             sha256sum of all of the above
#   versions                               "<package> <version>" per line (no v)
#
# The tarballs are reproducible (sorted, mtime 0, owner 0, gzip -n), so the
# checksums only change when the binaries do. Everything is cached outside the
# repository; the unpacked binaries stay in bin/ next to artifacts/.
#
# Idempotent: when every artifact for the pinned versions is in the cache, it
# prints the directory and exits without building. Runs that start together
# build once: the others wait for the first (flock).
#
#   scripts/node-artifacts.sh        # build if needed, print the directory
#   KOK_TESTENV_DIR=/some/dir scripts/node-artifacts.sh
#
# The last line of the output is the directory holding artifacts/ and bin/.
set -euo pipefail

CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
# runc: the newest release (v1.6.0-rc.1 is a release candidate).
RUNC_VERSION=${RUNC_VERSION:-v1.5.2}
CNI_VERSION=${CNI_VERSION:-v1.10.0}
# cri-tools: the proxy has v1.34.0 and v1.37.0, none for 1.35; crictl talks CRI
# v1, which kubelet 1.35 and containerd 2 serve.
CRICTL_VERSION=${CRICTL_VERSION:-v1.37.0}
K8S_VERSION=${K8S_VERSION:-v1.35.4}
KUBELET_NEXT_VERSION=${KUBELET_NEXT_VERSION:-v1.35.8}

here=$(cd "$(dirname "$0")" && pwd)
root=${KOK_TESTENV_DIR:-$HOME/.cache/kube-on-kube}
dir="$root/node-containerd-$CONTAINERD_VERSION-runc-$RUNC_VERSION-cni-$CNI_VERSION-crictl-$CRICTL_VERSION-kubelet-$K8S_VERSION"
bin="$dir/bin"
out="$dir/artifacts"
cv=${CONTAINERD_VERSION#v}
containerd_tgz="containerd-$cv-linux-amd64.tar.gz"
cni_tgz="cni-plugins-linux-amd64-$CNI_VERSION.tgz"
crictl_tgz="crictl-$CRICTL_VERSION-linux-amd64.tar.gz"
next_kubelet="kubelet-$KUBELET_NEXT_VERSION"
wanted=("$containerd_tgz" runc.amd64 "$cni_tgz" "$crictl_tgz" kubelet "$next_kubelet" SHA256SUMS versions)

have_all() {
  local f
  for f in "${wanted[@]}"; do [ -s "$out/$f" ] || return 1; done
}

if have_all; then
  echo "$dir"
  exit 0
fi

command -v go >/dev/null || { echo "go is required to build the node artifacts" >&2; exit 1; }
mkdir -p "$bin" "$out" "$dir/src"
log() { echo "[node-artifacts] $*" >&2; }
die() { echo "[node-artifacts] error: $*" >&2; exit 1; }
. "$here/cache-lock.sh"
cache_lock "$dir" node-artifacts have_all "$dir"
start=$(date +%s)
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
# The builds share the machine: they run at the lowest priority.
gobuild() { nice -n 19 go "$@"; }
# Records how long each piece took to build from cold, in build-seconds.
timed() { # name command...
  local name=$1 t0 t
  shift
  t0=$(date +%s)
  "$@"
  t=$(( $(date +%s) - t0 ))
  log "$name built in ${t}s"
  sed -i "/^$name /d" "$dir/build-seconds" 2>/dev/null || true
  echo "$name $t" >>"$dir/build-seconds"
}
# Reproducible gzip'd tarball of the named entries of a directory.
pack() { # tarball dir entries...
  local tgz=$1 from=$2
  shift 2
  tar -C "$from" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - "$@" \
    | gzip -n -9 >"$out/$tgz.tmp"
  mv "$out/$tgz.tmp" "$out/$tgz"
}
# Directory of a module version in the module cache, downloading it if needed.
moddir() { # module version
  (cd "$dir/src" && go mod download -json "$1@$2" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
}

# --- containerd -------------------------------------------------------------
# Static (no cgo): the CRI plugin is compiled in by default (it is only left out
# with the no_cri tag); without cgo the btrfs snapshotter is left out, overlayfs
# and native stay.
build_containerd() {
  local m=github.com/containerd/containerd/v2 stage="$dir/src/containerd"
  rm -rf "$stage" && mkdir -p "$stage/bin"
  local ld="-s -w -X $m/version.Version=$CONTAINERD_VERSION -X $m/version.Package=$m"
  log "building containerd, containerd-shim-runc-v2, ctr $CONTAINERD_VERSION"
  (cd "$dir/src" && CGO_ENABLED=0 GOBIN="$stage/bin" gobuild install -trimpath \
    -tags urfave_cli_no_docs -ldflags "$ld" \
    "$m/cmd/containerd@$CONTAINERD_VERSION" \
    "$m/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "$m/cmd/ctr@$CONTAINERD_VERSION")
  "$stage/bin/containerd" --version >&2
  "$stage/bin/containerd" config default | grep -q "io.containerd.cri.v1.runtime" \
    || die "containerd $CONTAINERD_VERSION was built without its CRI plugin"
  cp "$stage/bin/"* "$bin/"
  pack "$containerd_tgz" "$stage" bin/containerd bin/containerd-shim-runc-v2 bin/ctr
}

# --- runc -------------------------------------------------------------------
# From its Go module with cgo and libseccomp (Debian's libseccomp-dev), linked
# statically like the upstream runc.amd64, so it runs on any host.
build_runc() {
  local m=github.com/opencontainers/runc stage="$dir/src/runc"
  [ -e /usr/include/seccomp.h ] && { [ -e /usr/lib/x86_64-linux-gnu/libseccomp.a ] || [ -e /usr/lib/libseccomp.a ]; } \
    || die "runc needs libseccomp-dev (apt-get install libseccomp-dev) to build with seccomp"
  rm -rf "$stage" && mkdir -p "$stage"
  local ld="-s -w -X main.version=${RUNC_VERSION#v} -X main.gitCommit=$RUNC_VERSION -extldflags -static"
  log "building runc $RUNC_VERSION (cgo, seccomp, static)"
  (cd "$dir/src" && CGO_ENABLED=1 GOBIN="$stage" gobuild install -trimpath \
    -tags "seccomp urfave_cli_no_docs netgo osusergo" -ldflags "$ld" "$m@$RUNC_VERSION")
  "$stage/runc" --version >&2
  "$stage/runc" --version | grep -q '^libseccomp: ' || die "runc was built without seccomp"
  cp "$stage/runc" "$bin/runc"
  cp "$stage/runc" "$out/runc.amd64.tmp" && mv "$out/runc.amd64.tmp" "$out/runc.amd64"
}

# --- CNI plugins ------------------------------------------------------------
# Every Linux plugin of the release (plugins/{main,ipam,meta}/*), static.
build_cni() {
  local m=github.com/containernetworking/plugins stage="$dir/src/cni" src pkgs=() d
  rm -rf "$stage" && mkdir -p "$stage"
  src=$(moddir "$m" "$CNI_VERSION")
  [ -d "$src/plugins" ] || die "no plugins/ in $m@$CNI_VERSION"
  for d in "$src"/plugins/{main,ipam,meta}/*/; do
    d=${d%/}
    case "${d##*/}" in windows) continue ;; esac
    ls "$d"/*.go >/dev/null 2>&1 || continue
    pkgs+=("$m/${d#"$src"/}@$CNI_VERSION")
  done
  log "building ${#pkgs[@]} CNI plugins $CNI_VERSION"
  (cd "$dir/src" && CGO_ENABLED=0 GOBIN="$stage" gobuild install -trimpath -ldflags \
    "-s -w -X $m/pkg/utils/buildversion.BuildVersion=$CNI_VERSION" "${pkgs[@]}")
  local p
  for p in bridge host-local loopback portmap host-device ptp; do
    [ -x "$stage/$p" ] || die "CNI plugin $p missing from the build"
  done
  cp "$src/LICENSE" "$src/README.md" "$stage/" && chmod 0644 "$stage/LICENSE" "$stage/README.md"
  mkdir -p "$bin/cni" && cp "$stage"/* "$bin/cni/"
  local entries=()
  mapfile -t entries < <(cd "$stage" && ls | sed 's|^|./|')
  pack "$cni_tgz" "$stage" "${entries[@]}"
}

# --- crictl -----------------------------------------------------------------
build_crictl() {
  local m=sigs.k8s.io/cri-tools stage="$dir/src/crictl"
  rm -rf "$stage" && mkdir -p "$stage"
  log "building crictl $CRICTL_VERSION"
  (cd "$dir/src" && CGO_ENABLED=0 GOBIN="$stage" gobuild install -trimpath -ldflags \
    "-s -w -X $m/pkg/version.Version=$CRICTL_VERSION" "$m/cmd/crictl@$CRICTL_VERSION")
  "$stage/crictl" --version >&2
  cp "$stage/crictl" "$bin/"
  pack "$crictl_tgz" "$stage" crictl
}

# --- kubelet ----------------------------------------------------------------
# Built with the control plane by scripts/testenv-bins.sh; released as a plain
# binary (dl.k8s.io/<v>/bin/linux/amd64/kubelet). KUBELET_BIN_DIR names a
# directory that already holds kubelet (of $K8S_VERSION) and
# kubelet-$KUBELET_NEXT_VERSION instead.
copy_kubelet() { # name-in-bin version artifact
  local kbin=${KUBELET_BIN_DIR:-}
  [ -n "$kbin" ] || kbin=$(K8S_VERSION=$K8S_VERSION KUBELET_NEXT_VERSION=$KUBELET_NEXT_VERSION "$here/testenv-bins.sh" --kubelet-next | tail -n1)
  [ -x "$kbin/$1" ] || die "$kbin has no $1 (scripts/testenv-bins.sh builds it)"
  "$kbin/$1" --version | grep -qx "Kubernetes $2" \
    || die "$kbin/$1 is not $2: $("$kbin/$1" --version)"
  cp "$kbin/$1" "$bin/$3"
  cp "$kbin/$1" "$out/$3.tmp" && mv "$out/$3.tmp" "$out/$3"
}

[ -s "$out/$containerd_tgz" ] || timed containerd build_containerd
[ -s "$out/runc.amd64" ] || timed runc build_runc
[ -s "$out/$cni_tgz" ] || timed cni-plugins build_cni
[ -s "$out/$crictl_tgz" ] || timed crictl build_crictl
[ -s "$out/kubelet" ] || copy_kubelet kubelet "$K8S_VERSION" kubelet
[ -s "$out/$next_kubelet" ] || copy_kubelet "kubelet-$KUBELET_NEXT_VERSION" "$KUBELET_NEXT_VERSION" "$next_kubelet"

(cd "$out" && sha256sum "$containerd_tgz" runc.amd64 "$cni_tgz" "$crictl_tgz" kubelet "$next_kubelet" >SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS)
printf 'containerd %s\nrunc %s\ncni-plugins %s\ncrictl %s\nkubelet %s\nkubelet-next %s\n' "$cv" "${RUNC_VERSION#v}" \
  "${CNI_VERSION#v}" "${CRICTL_VERSION#v}" "${K8S_VERSION#v}" "${KUBELET_NEXT_VERSION#v}" >"$out/versions"
have_all || die "some artifacts are missing in $out"
took=$(( $(date +%s) - start ))
log "built in ${took}s; $(du -sh "$out" | cut -f1) in $out"
echo "$dir"
