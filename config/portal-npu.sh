# shellcheck shell=sh
# Environment for programs that run models on the NPU with the QAIRT v2.44
# runtime (QNN HTP backend): the voice pipeline, the LLM daemon, qnn-net-run.
#
#   . /usr/share/npud/portal-npu.sh
#
# POSIX sh; works when sourced from sh, dash, bash and zsh. Sourcing it again
# changes nothing: an entry already on a path is never added twice.
#
# Set before sourcing to override:
#   QAIRT_ROOT           where the runtime was restored by deploy_npu.sh
#                        (default /opt/qcom/qairt/2.44; its lib/ holds the
#                        aarch64 Linux libraries: libQnnHtp.so, libQnnSystem.so,
#                        libQnnHtpV73Stub.so, ...)
#   NPU_DSP_LIBRARY_DIR  the DSP-side libraries (libQnnHtpV73Skel.so, the
#                        shell) that the CDSP loads (default /usr/lib/dsp/cdsp)
#
# Exports:
#   QAIRT_ROOT
#   LD_LIBRARY_PATH     $QAIRT_ROOT/lib first, ':'-separated (never an empty
#                       entry, which would mean the current directory)
#   ADSP_LIBRARY_PATH   $NPU_DSP_LIBRARY_DIR first, ';'-separated: the DSP
#                       search path libcdsprpc and the HTP backend read

: "${QAIRT_ROOT:=/opt/qcom/qairt/2.44}"
: "${NPU_DSP_LIBRARY_DIR:=/usr/lib/dsp/cdsp}"
export QAIRT_ROOT NPU_DSP_LIBRARY_DIR

# _npu_path_with VALUE SEPARATOR ENTRY: prints VALUE with ENTRY in front
# unless ENTRY is already one of its elements. `case` instead of splitting on
# IFS keeps it independent of the caller's shell options (noglob, zsh's
# SH_WORD_SPLIT).
_npu_path_with() {
    case "$2$1$2" in
        *"$2$3$2"*) printf '%s\n' "$1" ;;
        "$2$2") printf '%s\n' "$3" ;;
        *) printf '%s\n' "$3$2$1" ;;
    esac
}

LD_LIBRARY_PATH=$(_npu_path_with "${LD_LIBRARY_PATH-}" ':' "$QAIRT_ROOT/lib")
ADSP_LIBRARY_PATH=$(_npu_path_with "${ADSP_LIBRARY_PATH-}" ';' "$NPU_DSP_LIBRARY_DIR")
export LD_LIBRARY_PATH ADSP_LIBRARY_PATH
unset -f _npu_path_with

# Say so on stderr if the runtime is not where this points: a missing
# library otherwise surfaces much later as a dlopen error inside QNN.
if [ ! -d "$QAIRT_ROOT/lib" ]; then
    printf 'portal-npu.sh: %s/lib does not exist; restore the QAIRT runtime with deploy_npu.sh or set QAIRT_ROOT\n' \
        "$QAIRT_ROOT" >&2
fi
if [ ! -d "$NPU_DSP_LIBRARY_DIR" ]; then
    printf 'portal-npu.sh: %s does not exist; restore the DSP libraries with deploy_npu.sh or set NPU_DSP_LIBRARY_DIR\n' \
        "$NPU_DSP_LIBRARY_DIR" >&2
fi
