#!/usr/bin/env bash
# Installs the Debian packages the tests need (needs root):
#
# - for the SSH test hosts of kok-testenv: sshd, the ssh client and
#   ssh-keygen, `ip`, `ps`/`pgrep`, curl, which tests run on the hosts to
#   download from the artifact server, and iptables, which a worker node's OS
#   has and the CNI portmap plugin runs on the host for a Pod's hostPort;
# - for building the worker nodes' software (scripts/node-software.sh): gcc,
#   the static C library and strip (pause; runc links statically), pkg-config
#   and libseccomp-dev (runc with seccomp), mmdebstrap and gpg (Debian root
#   filesystems for the images, from the Debian mirror), make and bzip2
#   (busybox from its source), python3 (a free port),
#   setcap (CoreDNS's capability) and the CA certificates (the image's, and
#   the Go module proxy's).
#
# Idempotent: installs only what is missing, running `apt-get update` only then.
set -euo pipefail

# package → a file it installs (a glob where the path has the architecture)
declare -A provides=(
  [openssh-server]=/usr/sbin/sshd
  [openssh-client]=/usr/bin/ssh
  [iproute2]=/usr/sbin/ip
  [iptables]=/usr/sbin/iptables
  [procps]=/usr/bin/pgrep
  [curl]=/usr/bin/curl
  [gcc]=/usr/bin/gcc
  [make]=/usr/bin/make
  [bzip2]=/usr/bin/bzip2
  [libc6-dev]='/usr/lib/*/libc.a'
  [binutils]=/usr/bin/strip
  [pkg-config]=/usr/bin/pkg-config
  [libseccomp-dev]='/usr/lib/*/libseccomp.a'
  [mmdebstrap]=/usr/bin/mmdebstrap
  [gpg]=/usr/bin/gpg
  [python3]=/usr/bin/python3
  [libcap2-bin]=/usr/sbin/setcap
  [ca-certificates]=/etc/ssl/certs/ca-certificates.crt
)
missing=()
for package in "${!provides[@]}"; do
  compgen -G "${provides[$package]}" >/dev/null || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # The package's own start of sshd fails harmlessly where no init system runs.
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
