# shellcheck shell=bash
# Helpers that install.sh and deploy_npu.sh share, sourced by both (they sit
# side by side in scripts/; neither is installed elsewhere). The caller sets
# PROG (the name messages start with) and, before calling target, root and
# live (1 when root is /).

# Exit statuses both scripts document in their --help (sysexits.h's, as npud's and
# npuctl's: npu_client/cli.py).
readonly EXIT_ERROR=1 EXIT_USAGE=64

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit "$EXIT_ERROR"
}

usage_error() {
    printf '%s: %s\nTry %s --help.\n' "$PROG" "$*" "$PROG" >&2
    exit "$EXIT_USAGE"
}

note() { printf '%s: %s\n' "$PROG" "$*"; }

warn() { printf '%s: warning: %s\n' "$PROG" "$*" >&2; }

# report WHAT PATH: one line per file, aligned.
report() { printf '%s: %-10s %s\n' "$PROG" "$1" "$2"; }

# need_value OPTION [VALUE...]: OPTION (the arguments left) has a non-empty value.
need_value() {
    [[ $# -ge 2 && -n $2 ]] || usage_error "$1 needs a value"
}

# target PATH: where absolute PATH of the installed system lies under the root.
# shellcheck disable=SC2154  # root and live are the caller's, set from its options
target() {
    if [[ $live == 1 ]]; then
        printf '%s\n' "$1"
    else
        printf '%s%s\n' "$root" "$1"
    fi
}

# hash_of FILE: its SHA-256, as 64 lower-case hex digits.
hash_of() {
    local line
    line=$(sha256sum -- "$1")
    printf '%s\n' "${line%% *}"
}

# new_file_owner: "UID GID" of the files written: root's when run as root;
# otherwise (a --root test tree) whoever runs the script.
new_file_owner() {
    if [[ $EUID -eq 0 ]]; then
        printf '0 0\n'
    else
        printf '%s %s\n' "$(id -u)" "$(id -g)"
    fi
}
