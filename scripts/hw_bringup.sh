#!/usr/bin/env bash
# The first run of npud on a device: check, test, trace, and pack everything
# into one tarball to bring back (docs/hardware.md says what to look at first).
set -uo pipefail

readonly PROG=hw_bringup.sh
repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)

usage() {
    cat <<EOF
Usage: scripts/hw_bringup.sh [OPTION...]

Bring npud up on a Snapdragon X Elite laptop for the first time and pack what
happened into one tarball. Every step runs even when an earlier one failed;
each writes its own log. Steps:

  1. system    kernel, remoteproc state, /dev/fastrpc-* nodes, fastrpc kernel log
  2. doctor    npud doctor (text and --json)
  3. tests     the hardware-marked tests (pytest -m hardware; needs a checkout)
  4. echo      npud trace record --scenario echo on the device, then replayed
  5. fidelity  npud trace record --scenario fidelity: UNSIGNED_PD_SUPPORT, which
               listener (handle 7 or 3) and remotectl (8 or 0) answered, what
               static handles 9 and 10 (no module) answer, and the apps_std
               calls the DSP's loader made, in order; then replayed
  6. model     npud trace record --scenario model --model FILE (with --model)
  7. daemon    npud --trace run with npuctl selftest and npuctl status --json
  8. suspend   (with --suspend; needs root and rtcwake) echo calls for 45 s
               with a suspend to RAM of 10 s in the middle (rtcwake -m mem):
               which calls failed, how long the longest took, and the trace
  9. library   npud's libcdsprpc (--shim) through npud (scripts/hw_checks.py):
               fastrpc_mmap with flags 2, 3 and the extended 17 and 18;
               capability attributes 1-11 and 128-131 from the library and
               from the kernel; a 300 MiB rpcmem buffer mapped into the DSP
 10. llama     llama.cpp's Hexagon backend through npud's libcdsprpc (with
               --llama-bin and --gguf): a 32-token greedy decode through npud
               against the CPU's, under a 120 s limit (docs/llm.md: the first
               dspqueue round trip may hang on mainline, qualcomm/fastrpc#377)
 11. mbuf      the same decode with llama.cpp's default GGML_HEXAGON_MBUF
               (step 10 sets 256)
 12. dspqueue  a dspqueue stress: --dspq-rounds decodes of 64 tokens with the
               library's full-system barriers (dmb sy, libcdsprpc's), then as
               many with inner-shareable ones (NPUD_SHIM_BARRIERS=inner);
               each must equal the CPU's, none may abort ("bad response")
 13. pack      OUT.tar.gz of everything, with summary.txt listing each step

Options:
  --out DIR        where to write (default: ./npud-bringup-HOST-DATE); the
                   tarball is DIR.tar.gz
  --model FILE     a model for step 5 (a QNN model library on the device;
                   an .onnx file on the emulator); without it step 5 is skipped
  --backend KIND   kernel (default), or emulator to rehearse without a device
  --config PATH    npud configuration (npud.toml) for steps 2, 4-6
  --python PATH    the Python with npud installed (default: the checkout's
                   .venv/bin/python if present, else python3)
  --llama-bin DIR  llama.cpp's bin directory (llama-simple, libggml-hexagon.so;
                   scripts/peer-llama.sh builds one) for steps 10-12
  --gguf FILE      the model steps 10-12 decode (a small one: it also runs on
                   the CPU)
  --dspq-rounds N  decodes per barrier setting in step 12 (default 10)
  --shim DIR       where npud's libcdsprpc.so.1 is (default: the checkout's
                   shim/build, made with make shim); without it step 9 is
                   skipped
  --skip-tests     skip step 3
  --suspend        run step 8: suspends this machine for 10 s (on the
                   emulator backend the calls run without a suspend)
  -h, --help       this text

Exit status (sysexits): 0 when every step that ran passed, 1 when one failed
(the tarball is written either way), 64 a bad command line, 66 a file named
that cannot be read, 69 no Python that imports npud, 73 --out exists or cannot
be made.

The tarball holds traces with the bytes of buffers and of the files the DSP
read (skels, models): share it only with whom you would give those.
EOF
}

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
# sysexits.h, as npud's and npuctl's (npu_client/cli.py).
readonly EX_USAGE=64 EX_NOINPUT=66 EX_UNAVAILABLE=69 EX_CANTCREAT=73
# die STATUS MESSAGE...
die() {
    local status=$1
    shift
    say "$*"
    exit "$status"
}
# value OPTION [VALUE]: a usage error when VALUE is missing or empty.
value() {
    [[ -n ${2:-} ]] || die "$EX_USAGE" "$1 needs a value (see --help)"
}

out=""
model=""
backend=kernel
config=""
python=""
skip_tests=0
suspend=0
llama_bin=""
gguf=""
dspq_rounds=10
shim=$repo/shim/build
while (($#)); do
    case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        --out) value --out "${2:-}"; out=$2; shift 2 ;;
        --model) value --model "${2:-}"; model=$2; shift 2 ;;
        --backend) value --backend "${2:-}"; backend=$2; shift 2 ;;
        --config) value --config "${2:-}"; config=$2; shift 2 ;;
        --python) value --python "${2:-}"; python=$2; shift 2 ;;
        --skip-tests) skip_tests=1; shift ;;
        --suspend) suspend=1; shift ;;
        --llama-bin) value --llama-bin "${2:-}"; llama_bin=$2; shift 2 ;;
        --gguf) value --gguf "${2:-}"; gguf=$2; shift 2 ;;
        --dspq-rounds) value --dspq-rounds "${2:-}"; dspq_rounds=$2; shift 2 ;;
        --shim) value --shim "${2:-}"; shim=$2; shift 2 ;;
        *) die "$EX_USAGE" "unknown option $1 (see --help)" ;;
    esac
done
case $backend in
    kernel | emulator) ;;
    *) die "$EX_USAGE" "--backend is kernel or emulator, not $backend" ;;
esac
if [[ ! $dspq_rounds =~ ^[1-9][0-9]{0,3}$ ]]; then
    die "$EX_USAGE" "--dspq-rounds is a count from 1 to 9999, not $dspq_rounds"
fi
if [[ -n $model && ! -r $model ]]; then
    die "$EX_NOINPUT" "--model $model: not a readable file"
fi
if [[ -n $config && ! -r $config ]]; then
    die "$EX_NOINPUT" "--config $config: not a readable file"
fi
if [[ -n $llama_bin || -n $gguf ]]; then
    [[ -n $llama_bin && -n $gguf ]] || die "$EX_USAGE" "--llama-bin and --gguf go together (steps 10-12)"
    [[ -x $llama_bin/llama-simple ]] || die "$EX_NOINPUT" "--llama-bin $llama_bin: no llama-simple in it"
    [[ -r $gguf ]] || die "$EX_NOINPUT" "--gguf $gguf: not a readable file"
    llama_bin=$(cd -- "$llama_bin" && pwd -P)  # the CPU run starts elsewhere
    gguf=$(cd -- "$(dirname -- "$gguf")" && pwd -P)/$(basename -- "$gguf")
fi
if [[ -z $python ]]; then
    if [[ -x $repo/.venv/bin/python ]]; then
        python=$repo/.venv/bin/python
    else
        python=python3
    fi
fi
if ! "$python" -c 'import npud, npu_client' 2>/dev/null; then
    die "$EX_UNAVAILABLE" "$python cannot import npud: make install, or --python PATH"
fi
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=${out:-$PWD/npud-bringup-$(hostname -s 2>/dev/null || echo host)-$stamp}
if [[ -e $out ]]; then
    die "$EX_CANTCREAT" "$out exists: choose another --out"
fi
mkdir -p -- "$out" || die "$EX_CANTCREAT" "cannot create $out"
summary=$out/summary.txt
failures=0
config_args=()
if [[ -n $config ]]; then
    config_args=(--config "$config")
fi

daemon_pid=""
stop_daemon() {
    if [[ -n $daemon_pid ]] && kill -0 "$daemon_pid" 2>/dev/null; then
        kill -TERM "$daemon_pid"
        wait "$daemon_pid" 2>/dev/null
    fi
}
trap stop_daemon EXIT

npud() { "$python" -m npud.daemon.main "$@"; }
npuctl() { "$python" -m npu_client.npuctl "$@"; }

# step NAME LOG COMMAND...: run COMMAND with its output in LOG; note the outcome.
step() {
    local name=$1 log=$out/$2
    shift 2
    say "$name ..."
    if "$@" >"$log" 2>&1; then
        printf '%-8s ok      %s\n' "$name" "$(basename -- "$log")" >>"$summary"
    else
        local status=$?
        printf '%-8s FAILED  %s (exit %s)\n' "$name" "$(basename -- "$log")" "$status" >>"$summary"
        failures=$((failures + 1))
        say "$name failed (exit $status): see $log"
    fi
}

skip() {
    printf '%-8s skipped %s\n' "$1" "$2" >>"$summary"
}

{
    echo "npud bring-up, $stamp, backend $backend"
    echo "npud $(npud --version 2>/dev/null || echo '?')"
    echo
} >"$summary"

system_info() {
    echo "== uname"; uname -a
    echo "== os-release"; cat /etc/os-release 2>/dev/null
    echo "== id"; id
    echo "== device nodes"; ls -l /dev/fastrpc-* /dev/dma_heap 2>&1
    echo "== remoteproc"
    local rproc
    for rproc in /sys/class/remoteproc/remoteproc*; do
        [[ -d $rproc ]] || continue
        printf '%s: %s %s\n' "$rproc" "$(cat "$rproc/name" 2>/dev/null)" "$(cat "$rproc/state" 2>/dev/null)"
    done
    echo "== devicetree model"; tr -d '\0' </sys/firmware/devicetree/base/model 2>/dev/null; echo
    echo "== modules"; grep -i fastrpc /proc/modules 2>&1
    echo "== kernel log (fastrpc, remoteproc, cdsp)"
    dmesg 2>&1 | grep -iE 'fastrpc|remoteproc|cdsp|qcom_q6v5' | tail -n 200
    return 0
}
step system system.txt system_info

step doctor doctor.txt npud doctor "${config_args[@]}"
npud doctor "${config_args[@]}" --json >"$out/doctor.json" 2>/dev/null

if ((skip_tests)); then
    skip tests "--skip-tests"
elif [[ ! -d $repo/tests ]]; then
    skip tests "no tests/ beside this script (run it from a checkout)"
else
    step tests tests.txt "$python" -m pytest -m hardware -p no:cacheprovider -q \
        --junitxml="$out/tests.xml" "$repo/tests"
fi

record() {
    local name=$1
    shift
    npud trace record --backend "$backend" "${config_args[@]}" "$@" "$out/$name.jsonl" &&
        npud trace replay "$out/$name.jsonl"
}
step echo echo.txt record echo --scenario echo
step fidelity fidelity.txt record fidelity --scenario fidelity
if [[ -n $model ]]; then
    step model model.txt record model --scenario model --model "$model"
else
    skip model "no --model"
fi

# wait_for_socket SOCKET PID: up to 10 s for the daemon PID to bind SOCKET (or to die).
wait_for_socket() {
    local tries
    for ((tries = 0; tries < 100; tries++)); do
        [[ -S $1 ]] && return
        kill -0 "$2" 2>/dev/null || return
        sleep 0.1
    done
}

daemon_run() {
    local socket=$out/npud.sock pid
    # Python itself in the background (not a function): $! is the daemon's pid.
    "$python" -m npud.daemon.main --backend "$backend" "${config_args[@]}" --socket "$socket" \
        --log-format json --trace "$out/daemon.jsonl" 2>"$out/daemon.log" &
    pid=$!
    daemon_pid=$pid
    wait_for_socket "$socket" "$pid"
    local status=0
    NPUD_SOCKET=$socket npuctl selftest || status=1
    NPUD_SOCKET=$socket npuctl status --json >"$out/status.json" || status=1
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
    fi
    wait "$pid" || status=1
    daemon_pid=""
    npud trace replay "$out/daemon.jsonl" || status=1
    return "$status"
}
step daemon daemon.txt daemon_run

# What a suspend does to a running call (docs/hardware.md): the kernel waits for a
# call interruptibly; the freezer may make the ioctl fail with EINTR, or restart it
# (the DSP then runs it twice), and may take the fd's heap buffers (later MUNMAPs
# EINVAL). The calls run on their own while the machine sleeps 10 s in the middle.
suspend_run() {
    local pid status=0 duration=45
    if [[ $backend == emulator ]]; then
        duration=2
    fi
    npud trace record --backend "$backend" "${config_args[@]}" --scenario suspend \
        --duration "$duration" "$out/suspend.jsonl" &
    pid=$!
    if [[ $backend == kernel ]]; then
        sleep 15
        echo "== rtcwake -m mem -s 10 at $(date -u +%H:%M:%S)"
        rtcwake -m mem -s 10 || status=1
        echo "== resumed at $(date -u +%H:%M:%S)"
    fi
    wait "$pid" || status=1
    npud trace replay "$out/suspend.jsonl" || status=1
    return "$status"
}
if ((suspend)); then
    if [[ $backend == kernel ]] && { ((EUID != 0)) || ! command -v rtcwake >/dev/null; }; then
        skip suspend "--suspend needs root and rtcwake"
    else
        step suspend suspend.txt suspend_run
    fi
else
    skip suspend "no --suspend"
fi

# daemon_start NAME: npud on a private socket ($out/npud-NAME.sock, log NAME-daemon.log);
# sets socket and daemon_pid. daemon_stop: SIGTERM, and its exit status.
daemon_start() {
    socket=$out/npud-$1.sock
    "$python" -m npud.daemon.main --backend "$backend" "${config_args[@]}" --socket "$socket" \
        --log-format json 2>"$out/$1-daemon.log" &
    daemon_pid=$!
    wait_for_socket "$socket" "$daemon_pid"
}
daemon_stop() {
    local status=0
    kill -TERM "$daemon_pid" 2>/dev/null
    wait "$daemon_pid" || status=1
    daemon_pid=""
    rm -f -- "$socket"
    return "$status"
}

# npud's libcdsprpc on this device (docs/hardware.md, What only a device can tell):
# which map flags the DSP takes (llama.cpp maps with 18 on DSPs newer than v79), what
# the capability attributes 128-131 (dspsignal, read by newer llama.cpp) answer from
# the library and the kernel, and whether a 300 MiB buffer (a tensor past llama.cpp's
# 256 MiB chunks) is allocated and mapped.
library_run() {
    local status=0 node_args=()
    daemon_start library
    if [[ $backend == kernel ]]; then
        local node
        for node in /dev/fastrpc-cdsp-secure /dev/fastrpc-cdsp; do
            if [[ -e $node ]]; then
                node_args=(--node "$node")
                break
            fi
        done
    fi
    NPUD_SOCKET=$socket NPUD_SHIM_LOG=1 "$python" "$repo/scripts/hw_checks.py" \
        maps caps rpcmem --library "$shim/libcdsprpc.so.1" "${node_args[@]}" || status=1
    NPUD_SOCKET=$socket npuctl status --json >"$out/library-status.json" || status=1
    daemon_stop || status=1
    return "$status"
}
if [[ -r $shim/libcdsprpc.so.1 ]]; then
    step library library.txt library_run
else
    skip library "no libcdsprpc.so.1 in $shim (make shim, or --shim DIR)"
fi

# decode NAME TOKENS [VAR=VALUE...]: llama-simple through npud's library with the
# environment given (GGML_HEXAGON_MBUF only when given: else llama.cpp's default); its
# text on stdout, its log in NAME.log. A hang past 120 s is the known risk of mainline
# kernels (qualcomm/fastrpc#377): the library's log says where.
decode() {
    local name=$1 tokens=$2
    shift 2
    env -u GGML_HEXAGON_MBUF NPUD_SOCKET="$socket" LD_LIBRARY_PATH="$shim" NPUD_SHIM_LOG=1 "$@" \
        timeout 120 "$llama_bin/llama-simple" -m "$gguf" -n "$tokens" "hello world" \
        2>"$out/$name.log"
}

# cpu_decode TOKENS: the same decode on the CPU alone: a copy of llama-simple in a
# directory without libggml-hexagon.so (ggml loads backends from the program's
# directory), so a system libcdsprpc cannot put it on the DSP.
cpu_decode() {
    local cpu_only=$out/llama-cpu-only
    mkdir -p -- "$cpu_only"
    cp -- "$llama_bin/llama-simple" "$llama_bin"/libggml-cpu*.so "$cpu_only/" || return 1
    (cd -- "$cpu_only" && LD_LIBRARY_PATH=$llama_bin timeout 300 ./llama-simple \
        -m "$gguf" -n "$1" "hello world" 2>"$out/llama-cpu-$1.log") || return 1
    if grep -q 'assigned to device HTP' "$out/llama-cpu-$1.log"; then
        echo "the CPU run used the DSP (llama-cpu-$1.log)" >&2
        return 1
    fi
}

# same NAME CPU NPU: the decode through npud ran, offloaded to HTP0, and equals the CPU's.
same() {
    printf 'cpu:  %s\nnpud: %s\n' "$2" "$3"
    if [[ -z $3 || $2 != "$3" ]]; then
        echo "the decode through npud failed or differs from the CPU's ($1.log)"
        return 1
    fi
    grep -q 'assigned to device HTP0' "$out/$1.log" ||
        { echo "llama.cpp did not offload to HTP0 ($1.log)"; return 1; }
}

# llama.cpp through npud with the MBUF docs/llm.md gives: the texts must be equal.
llama_run() {
    local status=0 cpu npu
    daemon_start llama
    cpu=$(cpu_decode 32) || status=1
    npu=$(decode llama-npud 32 GGML_HEXAGON_MBUF=256 \
        NPUD_SHIM_STATS="$out/llama-requests.txt") || status=1
    same llama-npud "$cpu" "$npu" || status=1
    NPUD_SOCKET=$socket npuctl status --json >"$out/llama-status.json" || status=1
    daemon_stop || status=1
    return "$status"
}

# llama.cpp's own default GGML_HEXAGON_MBUF: whether its buffers (each chunk rounded up
# to 4 KiB plus a 4 KiB guard page) fit npud's per-buffer ceiling and quota here.
mbuf_run() {
    local status=0 cpu npu
    daemon_start mbuf
    cpu=$(cpu_decode 32) || status=1
    npu=$(decode llama-default-mbuf 32) || status=1
    same llama-default-mbuf "$cpu" "$npu" || status=1
    NPUD_SOCKET=$socket npuctl status --json >"$out/mbuf-status.json" || status=1
    daemon_stop || status=1
    return "$status"
}

# The dspqueue ring ordered with full-system barriers (dmb sy / dmb st, as libcdsprpc's
# dspqueue_cpu.c), the library's default, then with inner-shareable ones (dmb ish,
# NPUD_SHIM_BARRIERS=inner): whether the IO-coherent CDSP ever sees a torn packet
# ("bad response", or a text that differs from the CPU's) with the cheaper ordering.
dspqueue_run() {
    local status=0 cpu npu round setting failed
    daemon_start dspqueue
    cpu=$(cpu_decode 64) || status=1
    for setting in system inner; do
        failed=0
        for ((round = 1; round <= dspq_rounds; round++)); do
            local name=dspqueue-$setting-$round barriers=()
            if [[ $setting == inner ]]; then
                barriers=(NPUD_SHIM_BARRIERS=inner)
            fi
            if ! npu=$(decode "$name" 64 "${barriers[@]}") || [[ $npu != "$cpu" ]] ||
                grep -q 'bad response' "$out/$name.log"; then
                failed=$((failed + 1))
                echo "$setting round $round: differs or aborted ($name.log)"
            fi
        done
        echo "ANSWER dspqueue barriers $setting: $failed of $dspq_rounds rounds failed"
        if ((failed)); then
            status=1
        fi
    done
    NPUD_SOCKET=$socket npuctl status --json >"$out/dspqueue-status.json" || status=1
    daemon_stop || status=1
    return "$status"
}
if [[ -n $llama_bin && -n $gguf ]]; then
    step llama llama.txt llama_run
    step mbuf mbuf.txt mbuf_run
    step dspqueue dspqueue.txt dspqueue_run
else
    skip llama "no --llama-bin and --gguf"
    skip mbuf "no --llama-bin and --gguf"
    skip dspqueue "no --llama-bin and --gguf"
fi

{
    echo
    if ((failures)); then
        echo "$failures step(s) failed: start with the first FAILED line's log (docs/hardware.md)"
    else
        echo "every step that ran passed"
    fi
} >>"$summary"
rm -f -- "$out/npud.sock"
tar -C "$(dirname -- "$out")" -czf "$out.tar.gz" "$(basename -- "$out")" ||
    { say "packing $out.tar.gz failed"; exit 1; }
cat -- "$summary"
say "bring this back: $out.tar.gz"
((failures == 0))
