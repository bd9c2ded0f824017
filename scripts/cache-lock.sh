# shellcheck shell=bash
# Sourced by the scripts that build into a cache directory.
#
# cache_lock DIR NAME DONE OUT: holds DIR/.lock until the script exits, so
# that runs started together (tests calling the script in parallel, CI and
# scripts/test.sh) build once. A run that finds the lock taken says so and
# waits. Once it holds the lock, the script exits printing OUT when the
# command DONE says the cache is complete (another run built it meanwhile).
cache_lock() {
  exec 9>"$1/.lock"
  if ! flock -n 9; then
    echo "[$2] waiting for the build running in $1" >&2
    flock 9
  fi
  if $3; then
    echo "$4"
    exit 0
  fi
}
