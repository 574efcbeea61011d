#!/usr/bin/env bash
# Install the Debian packages the test suite's tool-backed tests need, where
# missing. `make test` runs this first; .ci/run then forbids those tests to skip.
set -euo pipefail

readonly PROG=test-deps.sh

# tool|package|why: a tool is a command on PATH or an absolute path that must exist.
readonly NEEDS=(
    "gcc|gcc|the ABI check and the skels' host build compile C"
    "make|make|the skels' host build and npud's libcdsprpc (shim/)"
    "/usr/include/misc/fastrpc.h|linux-libc-dev|the ABI check reads the kernel's uapi header"
    "shellcheck|shellcheck|every shell script is linted"
    "systemd-analyze|systemd|systemd-analyze verify and security on the units"
    "systemd-sysusers|systemd|sysusers.d applied to a scratch root"
    "systemd-tmpfiles|systemd|tmpfiles.d applied to a scratch root"
    "/bin/kill|procps|the unit's ExecReload= must exist for systemd-analyze verify"
    "zstd|zstd|doctor reads zstd-compressed firmware"
    "dash|dash|config/portal-npu.sh is sourced by POSIX shells"
    "groff|groff-base|the man pages are checked by groff"
    "g++|g++|npud's libcdsprpc headers are checked as C++ (llama.cpp includes them)"
    "/usr/include/msgpack.h|libmsgpack-dev|npud's libcdsprpc speaks msgpack through msgpack-c"
    "cmake|cmake|make peer-llama (run by .ci/run) builds llama.cpp"
    "aarch64-linux-gnu-gcc|gcc-aarch64-linux-gnu|the dspqueue ring's ARM barriers are checked in code built for aarch64"
)

usage() {
    local need tool package why table=""
    for need in "${NEEDS[@]}"; do
        IFS='|' read -r tool package why <<<"$need"
        table+=$(printf '  %-28s %-16s %s' "$tool" "($package)" "$why")$'\n'
    done
    cat <<EOF
Usage: $PROG [--check | --help]

Install the Debian packages whose tools the test suite needs, where missing.
As root it runs apt-get; as anyone else it lists what is missing and the
apt-get command to run, and the tests that need those tools skip (they fail
under .ci/run, which sets NPUD_REQUIRE_TOOLS=1).

Options:
  --check     install nothing; list what is missing, exit 1 if anything is
  -h, --help  show this help and install nothing

What is checked, and why:
$table
Exit status: 0 nothing missing (or all installed), 1 something missing with
--check or the installation failed, 64 bad usage (sysexits).
EOF
}

check_only=0
case ${1:-} in
    "") ;;
    --check) check_only=1 ;;
    -h | --help) usage; exit 0 ;;
    *) printf '%s: unknown argument: %s\nTry %s --help.\n' "$PROG" "$1" "$PROG" >&2; exit 64 ;;
esac

present() {
    if [[ $1 == /* ]]; then
        [[ -e $1 ]]
    else
        command -v "$1" >/dev/null
    fi
}

packages=()
tools=()
for need in "${NEEDS[@]}"; do
    IFS='|' read -r tool package _why <<<"$need"
    present "$tool" && continue
    tools+=("$tool")
    [[ " ${packages[*]} " == *" $package "* ]] || packages+=("$package")
done

if ((${#packages[@]} == 0)); then
    exit 0
fi
if [[ $check_only == 1 || $EUID -ne 0 ]]; then
    printf '%s: missing %s; install them with: sudo apt-get install %s\n' \
        "$PROG" "${tools[*]}" "${packages[*]}" >&2
    if [[ $check_only == 1 ]]; then
        exit 1
    fi
    printf '%s: the tests that need them skip until then\n' "$PROG" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    printf '%s: missing %s, and there is no apt-get to install %s\n' \
        "$PROG" "${tools[*]}" "${packages[*]}" >&2
    exit 1
fi
printf '%s: installing %s (for %s)\n' "$PROG" "${packages[*]}" "${tools[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
