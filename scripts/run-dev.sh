#!/usr/bin/env bash
# `make run`: start npud from the development venv on a socket the caller can
# use, and say which. As root the default is /run/npud/npud.sock; as anyone
# else a socket of their own, so a person never needs sudo to try npud.
set -euo pipefail

readonly PROG="make run"
readonly SYSTEM_SOCKET=/run/npud/npud.sock
readonly CLIENT_GROUP=npu
repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
# The daemon to run: the development venv's unless $NPUD names another.
readonly NPUD=${NPUD:-$repo/.venv/bin/npud}

usage() {
    cat <<EOF
Usage: scripts/run-dev.sh [SOCKET [NPUD-OPTION...]]   (what \`make run SOCKET=... ARGS=...\` runs)

Start npud (--backend auto: the emulator without a device) in the foreground.
SOCKET empty: $SYSTEM_SOCKET as root; otherwise
\$XDG_RUNTIME_DIR/npud/npud.sock, or /tmp/npud-UID/npud.sock without
XDG_RUNTIME_DIR. Stop it with Ctrl-C. Env: NPUD, the daemon to run
(default: the development venv's, $repo/.venv/bin/npud).
EOF
}

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }

case ${1:-} in
    -h | --help) usage; exit 0 ;;
esac
socket=${1:-}
shift || true
user=$(id -un)

# private_dir DIR: DIR exists (created 0700 if not), is ours and no one else's to write.
private_dir() {
    local dir=$1
    if [[ ! -e $dir ]]; then
        mkdir -m 0700 -- "$dir"
    fi
    if [[ -L $dir || ! -d $dir || $(stat -c '%u' -- "$dir") != "$EUID" ]] ||
        (($(stat -c '0%a' -- "$dir") & 022)); then
        say "$dir is not a directory of yours that only you can write; remove it, or pass SOCKET=PATH"
        exit 2
    fi
}

if [[ -z $socket ]]; then
    if [[ $EUID -eq 0 ]]; then
        socket=$SYSTEM_SOCKET
    elif [[ -n ${XDG_RUNTIME_DIR:-} && -d $XDG_RUNTIME_DIR && -O $XDG_RUNTIME_DIR ]]; then
        socket=$XDG_RUNTIME_DIR/npud/npud.sock
    else
        private_dir "${TMPDIR:-/tmp}/npud-$EUID"
        socket=${TMPDIR:-/tmp}/npud-$EUID/npud.sock
    fi
fi

# Can we create the socket? npud would say "Permission denied"; say what to do instead.
dir=$(dirname -- "$socket")
existing=$dir
while [[ ! -e $existing ]]; do
    existing=$(dirname -- "$existing")
done
if [[ ! -w $existing || ! -x $existing ]]; then
    say "$user cannot create $socket ($existing is not writable for $user)"
    say "run \`make run\` without SOCKET= to get a socket of your own, or pass SOCKET=PATH in a directory you own;"
    say "the system's npud (npud.socket) serves $SYSTEM_SOCKET to members of the $CLIENT_GROUP group (docs/deploy.md)"
    exit 2
fi

if [[ $socket == "$SYSTEM_SOCKET" ]]; then
    say "serving on $socket, the clients' default"
else
    say "serving on $socket as $user; in other terminals: export NPUD_SOCKET=$socket"
fi
if [[ $EUID -eq 0 ]]; then
    say "as root the socket is root's (mode 0660, group root): only root can connect;"
    say "for other users, run \`make run\` as that user instead (no sudo), or set [daemon] socket_group to a group they are in, e.g. $CLIENT_GROUP (ARGS='--config FILE')"
fi
exec "$NPUD" --backend auto --socket "$socket" "$@"
