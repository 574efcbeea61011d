#!/usr/bin/env bash
# `make run`: start npud from the development venv on a socket the caller can
# use, and say which. As root the default is /run/npud/npud.sock; as anyone
# else a socket of their own, so a person never needs sudo to try npud.
# "serving" is said once npud is ready (run_until_ready.py), not before.
set -euo pipefail

readonly PROG="make run"
readonly SYSTEM_SOCKET=/run/npud/npud.sock
readonly CLIENT_GROUP=npu
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(cd -- "$here/.." && pwd -P)
# The daemon to run: the development venv's unless $NPUD names another.
readonly NPUD=${NPUD:-$repo/.venv/bin/npud}

usage() {
    cat <<EOF
Usage: scripts/run-dev.sh [SOCKET [NPUD-OPTION...]]   (what \`make run SOCKET=... ARGS=...\` runs)

Start npud (--backend auto: the emulator without a device) in the foreground.
SOCKET empty: $SYSTEM_SOCKET as root; otherwise
\$XDG_RUNTIME_DIR/npud/npud.sock, or /tmp/npud-UID/npud.sock without
XDG_RUNTIME_DIR. Says "starting", then "serving" once npud is ready (or how
it ended). Stop it with Ctrl-C. Needs python3 on PATH. Exit status: npud's
(npud --help), or 73 when SOCKET cannot be created, 69 when python3 or the
venv's Python cannot be run. Env: NPUD, the daemon
to run (default: the development venv's, $repo/.venv/bin/npud).
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
        exit 73 # EX_CANTCREAT
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
    exit 73 # EX_CANTCREAT
fi

# runnable_python: the first Python 3.11 or newer that this user can run, or nothing.
runnable_python() {
    local candidate
    for candidate in "$(command -v python3 || true)" /usr/bin/python3 /usr/local/bin/python3; do
        if [[ -n $candidate && -x $candidate ]] &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            printf '%s\n' "$candidate"
            return
        fi
    done
}

# npud is a script whose #! line names the venv's python. A venv made by
# another user can name one this user cannot run (root's pyenv under /root):
# exec would fail with "bad interpreter: Permission denied". Say which to use.
if [[ -f $NPUD && -r $NPUD ]]; then
    IFS= read -r shebang <"$NPUD" || true
    if [[ $shebang == '#!'* ]]; then
        interpreter=${shebang#'#!'}
        interpreter=${interpreter#"${interpreter%%[! ]*}"}
        interpreter=${interpreter%% *}
        if [[ ! -x $interpreter ]]; then
            say "$user cannot run $interpreter, the Python that $NPUD names"
            real=$(readlink -f -- "$interpreter" 2>/dev/null || true)
            if [[ -n $real && $real != "$interpreter" ]]; then
                say "(it is $real, which $user cannot reach or execute)"
            fi
            python=$(runnable_python)
            if [[ -n $python ]]; then
                say "make the venv with a Python every user can run, e.g. $python: make clean && make install PYTHON=$python"
            else
                say "install a Python 3.11 or newer that every user can run (sudo apt-get install python3 python3-venv), then: make clean && make install PYTHON=/usr/bin/python3"
            fi
            say "or run \`make run\` as the user whose venv it is"
            exit 69 # EX_UNAVAILABLE
        fi
    fi
fi

supervisor=$(command -v python3 || true)
if [[ -z $supervisor ]]; then
    say "python3 is not on PATH: it tells when npud is ready (sudo apt-get install python3)"
    exit 69 # EX_UNAVAILABLE
fi

if [[ $socket == "$SYSTEM_SOCKET" ]]; then
    say "starting npud on $socket, the clients' default"
    ready="serving on $socket, the clients' default"
else
    say "starting npud on $socket as $user"
    ready="serving on $socket as $user; in other terminals: export NPUD_SOCKET=$socket"
fi
if [[ $EUID -eq 0 ]]; then
    say "as root the socket is root's (mode 0660, group root): only root can connect;"
    say "for other users, run \`make run\` as that user instead (no sudo), or set [daemon] socket_group to a group they are in, e.g. $CLIENT_GROUP (ARGS='--config FILE')"
fi
exec "$supervisor" "$here/run_until_ready.py" --prog "$PROG" --ready "$ready" \
    -- "$NPUD" --backend auto --socket "$socket" "$@"
