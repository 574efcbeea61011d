#!/usr/bin/env bash
# The client installs on its own, and speaks the daemon's version:
# `pip install ./protocol ./client` into a fresh venv (no npud), then compare
# its `npuctl --version` with `npud --version` of the development venv.
# Needs network access to the package index (msgspec, setuptools). Run by .ci/run.
set -euo pipefail

readonly PROG=check-client-install.sh
repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)

usage() {
    cat <<EOF2
Usage: $PROG [--help]

Create a temporary venv, pip-install $repo/protocol and $repo/client into it,
and check that its npuctl --version names the version of $repo/.venv/bin/npud
(make install creates that venv). Exit status: 0 they match, 1 otherwise, 64 bad
usage, 69 no development venv (sysexits).
EOF2
}

case ${1:-} in
    -h | --help) usage; exit 0 ;;
    "") ;;
    *) printf '%s: unknown argument: %s\n' "$PROG" "$1" >&2; exit 64 ;;
esac

npud=$repo/.venv/bin/npud
[[ -x $npud ]] || { printf '%s: %s is missing: run make install first\n' "$PROG" "$npud" >&2; exit 69; }

scratch=$(mktemp -d)
trap 'rm -rf -- "$scratch"' EXIT
"${PYTHON:-python3}" -m venv -- "$scratch/venv"
"$scratch/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "$repo/protocol" "$repo/client"

client=$("$scratch/venv/bin/npuctl" --version)
daemon=$("$npud" --version)
if (cd -- "$scratch" && "$scratch/venv/bin/python" -c "import npud") 2>/dev/null; then
    printf '%s: the client venv can import npud: the client must install without it\n' "$PROG" >&2
    exit 1
fi
client_version=${client#npuctl }
client_version=${client_version%% *}
if [[ $client_version != "${daemon#npud }" ]]; then
    printf '%s: %s, but %s\n' "$PROG" "$client" "$daemon" >&2
    exit 1
fi
printf '%s: %s matches %s\n' "$PROG" "$client" "$daemon"
