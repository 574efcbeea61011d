#!/usr/bin/env bash
# Cross-compile the npud DSP skels for the Hexagon CDSP with the Hexagon SDK:
# qaic turns idl/*.idl into the marshalling, hexagon-clang builds
# libecho_skel.so and libportal_qnn_skel.so. See docker/README.md.
set -euo pipefail

readonly PROG=build_skel.sh
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
readonly SCRIPT_DIR

usage() {
    cat <<'EOF'
Usage: build_skel.sh [options]

Cross-compile the npud DSP skels for the Hexagon CDSP with the Hexagon SDK.

  qaic -mdll idl/echo.idl, idl/portal_qnn.idl  ->  OUT/qaic/<iface>.h, <iface>_skel.c,
                                                   <iface>_stub.c
  hexagon-clang -m<arch> -G0 -fPIC -shared      ->  OUT/libecho_skel.so
                                                   OUT/libportal_qnn_skel.so
                                                   OUT/SHA256SUMS

The qaic-generated <iface>_skel.c replaces the hand-written marshalling of the
host build (skel/echo_skel.c, skel/portal_qnn_skel.c, skel/skel_marshal.c);
the implementations (skel/*_imp.c, qnn_model.c, skel_handles.c) are compiled
unchanged against the generated headers and the SDK's own remote.h,
AEEStdErr.h and HAP_farf.h. The <iface>_stub.c files are the HLOS side, which
npud does not use (it marshals in Python).

Install on the device: copy both libraries to /usr/lib/dsp/cdsp (the
ADSP_LIBRARY_PATH that npud's environment sets); see docker/README.md.

Options:
  --sdk DIR            Hexagon SDK root             (default: $HEXAGON_SDK_ROOT)
  --tools-version VER  HEXAGON_Tools version under DIR/tools/HEXAGON_Tools
                       (default: $HEXAGON_TOOLS_VERSION, else the newest there)
  --arch ARCH          DSP architecture, vNN        (default: $HEXAGON_ARCH, else v73)
  --src DIR            npud source tree             (default: the tree holding this
                                                     script, else the current directory)
  --out DIR            output directory             (default: SRC/build/hexagon-ARCH)
  -h, --help           show this help and exit

Environment: QAIC overrides the qaic binary (default: the first of
DIR/ipc/fastrpc/qaic/Ubuntu/qaic and DIR/ipc/fastrpc/qaic/bin/qaic).

Exit status (sysexits): 0 built, 1 a build step failed, 64 bad usage, 69 SDK not found.
EOF
}

# sysexits.h, as npud's and npuctl's (npu_client/cli.py).
readonly EX_USAGE=64 EX_UNAVAILABLE=69
# die STATUS MESSAGE...
die() {
    local status=$1
    shift
    printf '%s: %s\n' "$PROG" "$*" >&2
    exit "$status"
}

# Print a command the way a shell would read it back, then run it.
run() {
    printf '+'
    printf ' %q' "$@"
    printf '\n'
    "$@"
}

sdk="${HEXAGON_SDK_ROOT:-}"
tools_version="${HEXAGON_TOOLS_VERSION:-}"
arch="${HEXAGON_ARCH:-v73}"
src=""
out=""

while (($# > 0)); do
    case "$1" in
    -h | --help)
        usage
        exit 0
        ;;
    --sdk | --tools-version | --arch | --src | --out)
        (($# >= 2)) || die "$EX_USAGE" "$1 needs a value (see --help)"
        case "$1" in
        --sdk) sdk="$2" ;;
        --tools-version) tools_version="$2" ;;
        --arch) arch="$2" ;;
        --src) src="$2" ;;
        --out) out="$2" ;;
        esac
        shift 2
        ;;
    *)
        die "$EX_USAGE" "unknown argument: $1 (see --help)"
        ;;
    esac
done

[[ "$arch" =~ ^v[0-9]{2}$ ]] || die "$EX_USAGE" "--arch must look like v73, not '$arch'"

if [[ -z "$src" ]]; then
    if [[ -f "$SCRIPT_DIR/../skel/Makefile" ]]; then
        src="$(cd -- "$SCRIPT_DIR/.." && pwd)"
    else
        src="$PWD"
    fi
fi
for needed in idl/echo.idl idl/portal_qnn.idl skel/echo_imp.c skel/portal_qnn_imp.c; do
    [[ -f "$src/$needed" ]] || die "$EX_USAGE" "$src is not the npud source tree ($needed missing); pass --src"
done
out="${out:-$src/build/hexagon-$arch}"

[[ -n "$sdk" ]] || die "$EX_UNAVAILABLE" "no Hexagon SDK: set HEXAGON_SDK_ROOT or pass --sdk (see --help)"
[[ -d "$sdk/incs" ]] || die "$EX_UNAVAILABLE" "$sdk does not look like a Hexagon SDK root (no incs/ directory)"

qaic="${QAIC:-}"
if [[ -z "$qaic" ]]; then
    for candidate in "$sdk/ipc/fastrpc/qaic/Ubuntu/qaic" "$sdk/ipc/fastrpc/qaic/bin/qaic"; do
        if [[ -x "$candidate" ]]; then
            qaic="$candidate"
            break
        fi
    done
fi
[[ -n "$qaic" && -x "$qaic" ]] || die "$EX_UNAVAILABLE" "qaic not found under $sdk/ipc/fastrpc/qaic (set QAIC)"

tools_root="$sdk/tools/HEXAGON_Tools"
if [[ -z "$tools_version" ]]; then
    [[ -d "$tools_root" ]] || die "$EX_UNAVAILABLE" "no $tools_root directory"
    tools_version="$(find "$tools_root" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort -V | tail -n 1)"
    [[ -n "$tools_version" ]] || die "$EX_UNAVAILABLE" "no toolchain under $tools_root"
fi
tools_bin="$tools_root/$tools_version/Tools/bin"
clang="$tools_bin/hexagon-clang"
[[ -x "$clang" ]] || die "$EX_UNAVAILABLE" "hexagon-clang not found at $clang (check --tools-version)"

qurt="$sdk/rtos/qurt/compute$arch"
[[ -d "$qurt/include/posix" ]] || die "$EX_UNAVAILABLE" "no QuRT headers for $arch at $qurt/include (is $arch supported by this SDK?)"

generated="$out/qaic"
objects="$out/obj"
mkdir -p -- "$generated" "$objects"

printf '%s: SDK %s%s, tools %s, arch %s, output %s\n' "$PROG" "$sdk" \
    "${HEXAGON_SDK_VERSION:+ (version $HEXAGON_SDK_VERSION)}" "$tools_version" "$arch" "$out"

# 1. The marshalling: <iface>.h, <iface>_skel.c, <iface>_stub.c per IDL.
for idl in echo portal_qnn; do
    run "$qaic" -mdll -I "$sdk/incs" -I "$sdk/incs/stddef" -o "$generated" "$src/idl/$idl.idl"
    for file in "$idl.h" "${idl}_skel.c"; do
        [[ -f "$generated/$file" ]] || {
            printf '%s: qaic did not write %s\n' "$PROG" "$generated/$file" >&2
            exit 1
        }
    done
done

# 2. Compile. The generated headers come first, so an implementation that
#    drifted from its IDL fails here. skel/include holds only our own headers
#    (its sdk/ and qaic/ stand-ins are for the host build and are not used).
common=(
    -m"$arch" -G0 -O2 -fPIC -fvisibility=hidden -std=c11 -D_POSIX_C_SOURCE=200809L
    -I "$generated" -I "$src/skel/include"
    -I "$sdk/incs" -I "$sdk/incs/stddef" -I "$sdk/ipc/fastrpc/incs"
    -I "$qurt/include/qurt" -I "$qurt/include/posix"
)
# Our sources are held to the host build's warnings.
ours=(
    -Wall -Wextra -Werror -Wshadow -Wconversion -Wsign-conversion -Wcast-qual
    -Wformat=2 -Wpointer-arith -Wstrict-prototypes -Wmissing-prototypes
)
# qaic's code is not ours to fix; its invoke entry must stay visible to dlsym.
generated_flags=(-Wall '-D__QAIC_SKEL_EXPORT=__attribute__((visibility("default")))')

compile_library() {
    local name="$1"
    shift
    local objs=() source object
    object="$objects/${name}_skel_qaic.o"
    run "$clang" "${common[@]}" "${generated_flags[@]}" -c "$generated/${name}_skel.c" -o "$object"
    objs+=("$object")
    for source in "$@"; do
        object="$objects/${name}_$(basename -- "$source" .c).o"
        run "$clang" "${common[@]}" "${ours[@]}" -c "$src/skel/$source" -o "$object"
        objs+=("$object")
    done
    # 3. Link. dlopen, pthread_* and libc resolve at load time inside the DSP
    #    user process, so nothing else is linked in.
    run "$clang" -m"$arch" -G0 -fPIC -shared -Wl,-soname,"lib${name}_skel.so" \
        -o "$out/lib${name}_skel.so" "${objs[@]}"
}

compile_library echo echo_imp.c skel_handles.c
compile_library portal_qnn portal_qnn_imp.c qnn_model.c skel_handles.c

# 4. The invoke entries must be exported, or remotectl's dlsym fails on the device.
nm_tool=""
for candidate in "$tools_bin/hexagon-llvm-nm" "$tools_bin/hexagon-nm"; do
    if [[ -x "$candidate" ]]; then
        nm_tool="$candidate"
        break
    fi
done
if [[ -n "$nm_tool" ]]; then
    for name in echo portal_qnn; do
        if ! "$nm_tool" -D --defined-only "$out/lib${name}_skel.so" |
            grep -q "[[:space:]]${name}_skel_handle_invoke\$"; then
            printf '%s: lib%s_skel.so does not export %s_skel_handle_invoke\n' \
                "$PROG" "$name" "$name" >&2
            exit 1
        fi
    done
else
    printf '%s: warning: no hexagon nm in %s, exported symbols not checked\n' "$PROG" "$tools_bin" >&2
fi

(cd -- "$out" && sha256sum libecho_skel.so libportal_qnn_skel.so >SHA256SUMS)

cat <<EOF
$PROG: built
  $out/libecho_skel.so
  $out/libportal_qnn_skel.so
  $out/SHA256SUMS
Install on the device into /usr/lib/dsp/cdsp (mode 0644, root-owned).
EOF
