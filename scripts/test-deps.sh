#!/usr/bin/env bash
# Install the Debian packages the test suite uses, where missing.
#   gcc, make, linux-libc-dev  the ABI check compiles against the kernel's uapi header;
#                              the skels' host build
#   the linter "shellcheck"    every shell script is linted
#   systemd, procps            systemd-analyze verify/security on the units (/bin/kill)
# Without root it only says what is missing: the tests that need a tool skip with a reason.
set -euo pipefail

need=()
command -v gcc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)
test -f /usr/include/misc/fastrpc.h || need+=(linux-libc-dev)
command -v shellcheck >/dev/null || need+=(shellcheck)
command -v systemd-analyze >/dev/null || need+=(systemd)
test -x /bin/kill || need+=(procps)

if ((${#need[@]} == 0)); then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "test-deps: missing ${need[*]}; install them (apt-get install ${need[*]}) or the tests that need them skip" >&2
  exit 0
fi
echo "test-deps: installing ${need[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
