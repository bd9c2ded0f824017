#!/usr/bin/env bash
# Builds the operators as static binaries (musl, no dynamic loader needed) for
# container images, then checks that each one runs (`--help`).
#
#   scripts/build-static.sh [BINARY...]    default: kube-on-kube-operator node-operator
#
# Output: ${CARGO_TARGET_DIR:-target}/<triple>/release/<binary>. The triple is <arch>-unknown-linux-musl
# for this machine's architecture (KOK_STATIC_TARGET overrides it). The musl target
# is added with rustup when it is missing. Where no musl target can be had,
# KOK_STATIC_TARGET=x86_64-unknown-linux-gnu builds a glibc binary with
# `-C target-feature=+crt-static` instead (static as well).
set -euo pipefail

cd "$(dirname "$0")/.."

binaries=("$@")
if [ ${#binaries[@]} -eq 0 ]; then
    binaries=(kube-on-kube-operator node-operator)
fi

target="${KOK_STATIC_TARGET:-$(uname -m)-unknown-linux-musl}"
log() { echo "[build-static] $*" >&2; }

if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx "$target"; then
    log "adding the rustup target $target"
    rustup target add "$target"
fi

# Static linking: musl targets link statically by default; asking for it
# explicitly also makes a gnu target static.
export RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static"
# The crypto crate (ring) compiles C: use a musl-aware compiler when there is
# one, else the system compiler (which works for ring's self-contained C).
case "$target" in
*-musl)
    cc_var="CC_$(echo "$target" | tr '-' '_')"
    if [ -z "${!cc_var:-}" ] && [ -z "${CC:-}" ]; then
        found=
        for cc in "${target%%-*}-linux-musl-gcc" musl-gcc; do
            if command -v "$cc" >/dev/null 2>&1; then
                export "$cc_var=$cc"
                found=1
                break
            fi
        done
        # On a musl system (Alpine) the plain compiler targets musl already.
        if [ -z "$found" ] && ! { ldd --version 2>&1 | grep -qi musl; }; then
            echo "no C compiler for $target: install musl-tools (Debian/Ubuntu: apt-get install musl-tools) or set $cc_var" >&2
            exit 1
        fi
    fi
    ;;
esac

args=()
for bin in "${binaries[@]}"; do
    args+=(--bin "$bin")
done
log "building ${binaries[*]} for $target"
cargo build --release --locked --target "$target" "${args[@]}"

for bin in "${binaries[@]}"; do
    path="${CARGO_TARGET_DIR:-target}/$target/release/$bin"
    if command -v file >/dev/null 2>&1; then
        description="$(file -b "$path")"
        log "$path: $description"
        case "$description" in
        *"dynamically linked"*)
            echo "$path is dynamically linked" >&2
            exit 1
            ;;
        esac
    fi
    if command -v ldd >/dev/null 2>&1 && ldd "$path" 2>&1 | grep -q '=>'; then
        echo "$path needs shared libraries:" >&2
        ldd "$path" >&2
        exit 1
    fi
    "$path" --help >/dev/null
    log "$path runs ($(du -h "$path" | cut -f1))"
done
