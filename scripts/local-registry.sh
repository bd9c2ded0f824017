# shellcheck shell=bash
# Sourced by the scripts that write a registry's storage.
#
# serve_registry BIN STORAGE WORKDIR: starts the registry BIN
# (github.com/distribution/distribution) on a free loopback port, serving
# the filesystem storage STORAGE, its configuration and log in WORKDIR; sets
# `reg` (HOST:PORT) and `regpid`, and returns once it answers (the caller's
# `die` otherwise). The caller stops it (kill $regpid).
serve_registry() {
  local bin=$1 storage=$2 work=$3 port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  reg="127.0.0.1:$port"
  cat >"$work/registry.yml" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $storage
  delete:
    enabled: true
http:
  addr: $reg
YAML
  "$bin" serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
  regpid=$!
  for _ in $(seq 100); do
    curl -fsS "http://$reg/v2/" >/dev/null 2>&1 && return 0
    kill -0 "$regpid" 2>/dev/null || die "the registry exited: $(tail -5 "$work/registry.log")"
    sleep 0.1
  done
  die "the registry does not answer on $reg"
}
