#!/usr/bin/env bash
# llama.cpp's Hexagon backend, built unmodified against npud's libcdsprpc
# (shim/README.md, "llama.cpp"). Every step is cached outside the tree.
set -euo pipefail

readonly PROG=peer-llama.sh
readonly VERSION=0.3.36
readonly SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
readonly DEFAULT_STEPS=(fetch cpu hexagon helpers models llm run)
readonly ALL_STEPS=(fetch cpu hexagon helpers models llm run)

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO
CACHE=${NPUD_PEER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/npud-peer}
readonly CACHE
JOBS=${JOBS:-$(nproc)}
readonly JOBS
# Seconds between the progress lines of a long build.
HEARTBEAT=${NPUD_PEER_HEARTBEAT:-30}
readonly HEARTBEAT
# No colour codes in what a log or CI captures: the tools that honour these.
export NO_COLOR=1
unset CLICOLOR_FORCE FORCE_COLOR
PYTHON=${PYTHON:-python3}
readonly PYTHON

readonly SDIST=$CACHE/dl/llama_cpp_python-$VERSION.tar.gz
readonly SRC=$CACHE/src/llama_cpp_python-$VERSION
readonly LLAMA=$SRC/vendor/llama.cpp
readonly HEX=$LLAMA/ggml/src/ggml-hexagon
readonly CPU_BUILD=$CACHE/build-cpu
readonly BIN=$CPU_BUILD/bin
readonly HEX_BUILD=$CACHE/hexagon
readonly HELPERS=$CACHE/helpers
readonly MODELS=$CACHE/models
readonly VENV=$CACHE/venv
readonly SHIM_BUILD=$CACHE/shim
readonly LLM=$CACHE/llm

usage() {
    cat <<EOF
Usage: $PROG [STEP...]
       $PROG --help

Build llama.cpp's Hexagon backend (ggml-hexagon, from the llama-cpp-python
$VERSION sdist on PyPI, unmodified) against npud's libcdsprpc headers and
the hand-written htp_iface stub (shim/include, shim/htp), with what its peer
test needs. Each step is cached and redone only when its inputs change.

Steps (default: ${DEFAULT_STEPS[*]}):
  fetch     download the sdist (pip), check its SHA-256, extract it
  cpu       llama.cpp CPU-only, backends as libraries (GGML_BACKEND_DL):
            test-llama-archs, llama-simple (about 10 minutes on 2 cores)
  hexagon   libggml-hexagon.so beside them, and npud's libcdsprpc.so.1
  helpers   libnpud-load-all.so: LD_PRELOAD that loads the backends before
            main(), so test-llama-archs sees the Hexagon device
  models    tiny GGUF llamas (f16, q8_0, q4_0) with a planted greedy answer
  llm       what npu_client's load_llm loads: $CACHE/llm (links to
            libllama and the ggml libraries above, libggml-hexagon.so and
            npud's libcdsprpc.so beside it), and llama-cpp-python $VERSION in
            the checkout's .venv, installed without a llama.cpp of its own
  run       llama.cpp through npud on the emulator (shim/peer/check_llama.py):
            greedy decodes equal to the CPU's, test-llama-archs, voice beside a
            decode, SIGKILL cleanup; prints the figures as JSON; then
            scripts/hw_bringup.sh's llama step against the emulator

Cache: \$NPUD_PEER_CACHE, else \$XDG_CACHE_HOME/npud-peer, else
~/.cache/npud-peer (now $CACHE). CI keeps it between steps.
Progress: a line when each step starts (with the log it writes, if any), a line
every \$NPUD_PEER_HEARTBEAT seconds (default 30) while a build runs (its own
progress, e.g. [212/430]), and its time when it ends; no colour codes.
Environment: JOBS (build jobs, default nproc), PYTHON (default python3).
Needs: gcc, g++, make, cmake, ninja (or make), python3 with venv and pip,
msgpack-c (libmsgpack-dev); network access to PyPI for fetch and models.

Exit status (sysexits): 0 done, 1 a step or a check failed, 64 bad usage, 69 a
tool or an earlier step's output is missing (the message says which).
EOF
}

log() {
    printf '%s: %s\n' "$PROG" "$*" >&2
}

die() {
    log "$*"
    exit 1
}

# sysexits.h, as npud's and npuctl's (npu_client/cli.py).
readonly EX_USAGE=64 EX_UNAVAILABLE=69

# unavailable MESSAGE: what a step needs is not there.
unavailable() {
    log "$*"
    exit "$EX_UNAVAILABLE"
}

need() {
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null || unavailable "missing $tool (install it: see --help)"
    done
}

# A digest of files (and words): a step is redone when its inputs' digest changes.
digest() {
    local item
    for item in "$@"; do
        if [[ -f $item ]]; then
            sha256sum "$item"
        else
            printf '%s\n' "$item"
        fi
    done | sha256sum | cut -d' ' -f1
}

fresh() { # fresh STAMP DIGEST: the stamp says the work was done for these inputs
    [[ -f $1 && $(<"$1") == "$2" ]]
}

# plain: stdin without terminal escape sequences (colours, cursor moves).
plain() {
    sed -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\x1b[()][A-Za-z0-9]//g'
}

timed() {
    local name=$1 start
    shift
    start=$(date +%s)
    "$@"
    log "$name: done in $(($(date +%s) - start)) s"
}

# build_progress LOG: the build's own progress in LOG (ninja's [N/M], make's [ N%]).
build_progress() {
    tail -c 8192 -- "$1" 2>/dev/null | tr '\r' '\n' | plain |
        grep -a -E -o '^\[ *[0-9]+(/[0-9]+|%)\]' | tail -n 1 || true
}

# run_logged NAME LOG COMMAND...: COMMAND's output into LOG (named before it starts),
# a progress line every $HEARTBEAT s while it runs; its status. Interrupted, it is
# stopped too (a background job of a script ignores SIGINT).
run_logged() {
    local name=$1 log=$2 start=$SECONDS last=$SECONDS pid status=0
    shift 2
    log "$name: log: $log"
    "$@" >"$log" 2>&1 &
    pid=$!
    # shellcheck disable=SC2064 # the pid is this job's, now
    trap "kill $pid 2>/dev/null; wait $pid 2>/dev/null; exit 130" INT TERM
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        if ((SECONDS - last >= HEARTBEAT)) && kill -0 "$pid" 2>/dev/null; then
            last=$SECONDS
            local progress
            progress=$(build_progress "$log")
            log "$name: still running after $((SECONDS - start)) s${progress:+, at $progress}"
        fi
    done
    wait "$pid" || status=$?
    trap - INT TERM
    return "$status"
}

# failed NAME LOG: say that NAME failed, with the end of its log, and exit 1.
failed() {
    log "$1 failed; the end of $2:"
    tail -n 20 -- "$2" | plain >&2
    die "$1 failed: see $2"
}

# install_file SRC DST: DST becomes a copy of SRC, replaced in one rename (a program
# running DST keeps the file it mapped); nothing is written when they are the same.
install_file() {
    cmp -s -- "$1" "$2" && return 0
    cp -p -- "$1" "$2.partial.$$"
    mv -f -- "$2.partial.$$" "$2"
}

step_fetch() {
    if [[ ! -f $SDIST ]]; then
        need "$PYTHON"
        mkdir -p "$CACHE/dl"
        log "downloading llama-cpp-python $VERSION (sdist) from PyPI"
        "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-python \
            "llama-cpp-python==$VERSION" -d "$CACHE/dl"
    fi
    local sum
    sum=$(sha256sum "$SDIST" | cut -d' ' -f1)
    [[ $sum == "$SDIST_SHA256" ]] || die "$SDIST: SHA-256 $sum, expected $SDIST_SHA256"
    if [[ ! -f $HEX/ggml-hexagon.cpp ]]; then
        local scratch=$CACHE/src.partial
        rm -rf "$scratch"
        mkdir -p "$scratch" "$CACHE/src"
        tar -xzf "$SDIST" -C "$scratch"
        rm -rf "$SRC"
        mv "$scratch/llama_cpp_python-$VERSION" "$SRC"
        rmdir "$scratch"
    fi
    [[ -f $HEX/ggml-hexagon.cpp ]] || die "the sdist has no ggml/src/ggml-hexagon"
}

step_cpu() {
    need cmake g++
    local generator=(-G "Unix Makefiles")
    if command -v ninja >/dev/null; then
        generator=(-G Ninja)
    fi
    if [[ ! -f $CPU_BUILD/CMakeCache.txt ]]; then
        log "cpu: configuring llama.cpp (CPU only, backends as libraries)"
        run_logged cpu "$CACHE/cpu-configure.log" \
            cmake -S "$LLAMA" -B "$CPU_BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
            -DGGML_BACKEND_DL=ON -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF \
            -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=OFF \
            -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF ||
            failed "configuring llama.cpp" "$CACHE/cpu-configure.log"
    fi
    log "cpu: building test-llama-archs and llama-simple with $JOBS jobs" \
        "(about 10 minutes on 2 cores the first time, seconds once built)"
    run_logged cpu "$CACHE/cpu-build.log" \
        cmake --build "$CPU_BUILD" -j "$JOBS" --target test-llama-archs llama-simple ||
        failed "the CPU build" "$CACHE/cpu-build.log"
}

step_hexagon() {
    need gcc g++ make
    [[ -f $BIN/libggml-base.so ]] || unavailable "no CPU build yet: run the cpu step"
    local inputs=("$REPO"/shim/include/*.h "$REPO"/shim/htp/* "$HEX/ggml-hexagon.cpp"
        "$HEX/htp-drv.cpp" "$BIN/libggml-base.so" "$VERSION")
    local sum
    sum=$(digest "${inputs[@]}")
    if ! fresh "$HEX_BUILD/stamp" "$sum"; then
        log "hexagon: compiling ggml-hexagon against npud's headers (under a minute)"
        mkdir -p "$HEX_BUILD"
        # Flags as CMake's ggml_add_backend_library sets them; __fp16 is only sizeof'd
        # on the host. No compat header: shim/include has what these sources need.
        local cxxflags=(-std=c++17 -O2 -fPIC -DNDEBUG -DGGML_BACKEND_BUILD -DGGML_BACKEND_SHARED
            -DGGML_BACKEND_DL -DGGML_SHARED -D__fp16=uint16_t
            -I"$REPO/shim/include" -I"$REPO/shim/htp" -I"$HEX" -I"$HEX/htp"
            -I"$LLAMA/ggml/src" -I"$LLAMA/ggml/include")
        g++ "${cxxflags[@]}" -c "$HEX/htp-drv.cpp" -o "$HEX_BUILD/htp-drv.o"
        g++ "${cxxflags[@]}" -c "$HEX/ggml-hexagon.cpp" -o "$HEX_BUILD/ggml-hexagon.o"
        gcc -std=c11 -O2 -fPIC -Wall -Wextra -Werror -I"$REPO/shim/include" \
            -I"$REPO/shim/htp" -c "$REPO/shim/htp/htp_iface_stub.c" \
            -o "$HEX_BUILD/htp_iface_stub.o"
        # shellcheck disable=SC2016 # $ORIGIN is for the dynamic linker
        g++ -shared -fPIC -o "$HEX_BUILD/libggml-hexagon.so" "$HEX_BUILD/ggml-hexagon.o" \
            "$HEX_BUILD/htp-drv.o" "$HEX_BUILD/htp_iface_stub.o" -L"$BIN" -lggml-base \
            -Wl,-rpath,'$ORIGIN' -ldl -lpthread -Wl,--no-undefined
        printf '%s\n' "$sum" >"$HEX_BUILD/stamp"
    fi
    # ggml_backend_load_all() finds backends beside the executable
    install_file "$HEX_BUILD/libggml-hexagon.so" "$BIN/libggml-hexagon.so"
    run_logged hexagon "$CACHE/shim-build.log" \
        make --no-print-directory -C "$REPO/shim" OUT="$SHIM_BUILD" ||
        failed "npud's libcdsprpc build" "$CACHE/shim-build.log"
}

step_helpers() {
    need gcc
    [[ -f $BIN/libggml.so ]] || unavailable "no CPU build yet: run the cpu step"
    local sum
    sum=$(digest "$REPO/shim/peer/load_all.c" "$BIN/libggml.so" "$VERSION")
    if ! fresh "$HELPERS/stamp" "$sum"; then
        mkdir -p "$HELPERS"
        gcc -std=c11 -O2 -fPIC -shared -Wall -Wextra -Werror -I"$LLAMA/ggml/include" \
            "$REPO/shim/peer/load_all.c" -o "$HELPERS/libnpud-load-all.so" \
            -L"$BIN" -lggml -lggml-base -Wl,-rpath,"$BIN"
        printf '%s\n' "$sum" >"$HELPERS/stamp"
    fi
}

step_models() {
    need "$PYTHON"
    local script=$REPO/shim/peer/make_tiny_llama.py sum
    if [[ ! -x $VENV/bin/python ]]; then
        "$PYTHON" -m venv "$VENV"
    fi
    sum=$(digest "$LLAMA/gguf-py/pyproject.toml" "$VERSION")
    if ! fresh "$VENV/stamp" "$sum"; then
        "$VENV/bin/python" -m pip install --quiet "$LLAMA/gguf-py"
        printf '%s\n' "$sum" >"$VENV/stamp"
    fi
    mkdir -p "$MODELS"
    local type
    for type in f16 q8_0 q4_0; do
        sum=$(digest "$script" "$type")
        if ! fresh "$MODELS/tiny-llama-$type.stamp" "$sum"; then
            "$VENV/bin/python" "$script" "$MODELS/tiny-llama-$type.gguf" --type "$type" >&2
            printf '%s\n' "$sum" >"$MODELS/tiny-llama-$type.stamp"
        fi
    done
}

# What load_llm loads (npu_client/_llm.py): llama.cpp's libraries in one directory, the
# Hexagon backend beside npud's libcdsprpc.so (it dlopens libcdsprpc.so from its own
# directory, $ORIGIN, before the system's), and the binding in .venv, whose own build of
# llama.cpp is switched off (LLAMA_BUILD=OFF): it loads this libllama instead.
step_llm() {
    [[ -f $BIN/libllama.so && -f $BIN/libggml-cpu.so ]] || unavailable "llm: no CPU build yet: run the cpu step"
    [[ -f $HEX_BUILD/libggml-hexagon.so && -f $SHIM_BUILD/libcdsprpc.so.1 ]] ||
        unavailable "llm: no Hexagon backend yet: run the hexagon step"
    local python=$REPO/.venv/bin/python lib installed
    [[ -x $python ]] || unavailable "llm: no $REPO/.venv (make install first)"
    mkdir -p "$LLM"
    for lib in libllama.so libggml.so libggml-base.so libggml-cpu.so; do
        ln -sfn "$BIN/$lib" "$LLM/$lib"
    done
    # A copy, not a link: its $ORIGIN must be this directory.
    install_file "$HEX_BUILD/libggml-hexagon.so" "$LLM/libggml-hexagon.so"
    ln -sfn "$SHIM_BUILD/libcdsprpc.so.1" "$LLM/libcdsprpc.so"
    printf '%s\n' "$VERSION" >"$LLM/llama-cpp-python.version"
    installed=$("$python" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' \
        2>/dev/null || true)
    if [[ $installed != "$VERSION" ]]; then
        log "llm: installing llama-cpp-python $VERSION into $REPO/.venv (no llama.cpp build)"
        run_logged llm "$CACHE/llm-install.log" \
            env CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" \
            "$python" -m pip install --quiet "$SDIST" ||
            failed "installing llama-cpp-python" "$CACHE/llm-install.log"
    fi
    log "llm: $LLM (load_llm finds it there; elsewhere, NPUD_LLAMA_LIB names it)"
}

# llama.cpp through npud on the emulator: shim/peer/check_llama.py starts npud from this
# checkout, checks greedy decodes, test-llama-archs, VAD beside a decode and SIGKILL
# cleanup, and prints the figures (round trips per token, time per batch, tokens/s).
step_run() {
    local python=$REPO/.venv/bin/python
    if [[ ! -x $python ]]; then
        unavailable "run: no $REPO/.venv (make install first)"
    fi
    [[ -x $BIN/llama-simple && -f $HEX_BUILD/libggml-hexagon.so && -f $MODELS/tiny-llama-q4_0.gguf ]] \
        || unavailable "run: the build is not complete: run the other steps first"
    log "run: llama.cpp through npud on the emulator (under a minute): a line per check"
    "$python" "$REPO/shim/peer/check_llama.py" --repo "$REPO" --bin "$BIN" --models "$MODELS" \
        --shim "$SHIM_BUILD" --preload "$HELPERS/libnpud-load-all.so"
    # The device bring-up's llama step (docs/hardware.md), rehearsed on the emulator.
    local rehearsal
    log "run: the bring-up's llama step, rehearsed on the emulator"
    rehearsal=$(mktemp -d)
    if ! bash "$REPO/scripts/hw_bringup.sh" --python "$python" --backend emulator --skip-tests \
        --out "$rehearsal/bringup" --llama-bin "$BIN" --gguf "$MODELS/tiny-llama-q4_0.gguf" \
        --shim "$SHIM_BUILD" >"$rehearsal/log" 2>&1 || ! grep -q '^llama *ok' "$rehearsal/bringup/summary.txt"; then
        cat -- "$rehearsal/log" "$rehearsal/bringup/llama.txt" | plain >&2 || true
        rm -rf -- "$rehearsal"
        die "run: the bring-up's llama step failed on the emulator"
    fi
    rm -rf -- "$rehearsal"
    log "run: the bring-up's llama step passed on the emulator"
}

main() {
    local steps=("$@") step known known_step
    if ((${#steps[@]} == 0)); then
        steps=("${DEFAULT_STEPS[@]}")
    fi
    for step in "${steps[@]}"; do
        case $step in
            -h | --help) usage; exit 0 ;;
        esac
        known=0
        for known_step in "${ALL_STEPS[@]}"; do
            [[ $step == "$known_step" ]] && known=1
        done
        if ((known == 0)); then
            printf '%s: unknown step: %s\nTry %s --help.\n' "$PROG" "$step" "$PROG" >&2
            exit "$EX_USAGE"
        fi
    done
    mkdir -p "$CACHE"
    log "steps: ${steps[*]}; cache: $CACHE (each step's log is named when it starts)"
    local index=0
    for step in "${steps[@]}"; do
        index=$((index + 1))
        log "step $index/${#steps[@]}: $step"
        timed "$step" "step_$step"
    done
    log "done: $BIN (llama.cpp, libggml-hexagon.so), $SHIM_BUILD, $HELPERS, $MODELS, $LLM"
}

main "$@"
