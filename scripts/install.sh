#!/usr/bin/env bash
# Lay out npud's system integration: the systemd units, sysusers.d and
# tmpfiles.d entries, the udev rule, the man pages and bash completion, the
# QAIRT environment script (vendor files, under --prefix, /usr by default),
# the configuration (the admin's, in /etc: never overwritten), the shell's
# signature reference files, and optionally the daemon's venv. Idempotent: a
# file already in place with the right content, mode and owner is left alone,
# and a run that changes nothing says so. docs/deploy.md walks through it.
set -euo pipefail
umask 022

readonly PROG=install.sh
SOURCE_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
readonly SOURCE_DIR
# shellcheck source=scripts/install-lib.sh
. "$SOURCE_DIR/scripts/install-lib.sh"
# ExecStart in systemd/npud.service points into this venv.
readonly VENV_DIR=/opt/npud/venv
readonly CONFIG_DIR=/etc/npud
readonly DEFAULT_PREFIX=/usr
readonly DSP_DIR=/usr/lib/dsp/cdsp
readonly SHELL_NAME=fastrpc_shell_unsigned_3
readonly PUBLIC_KEY_NAME=shell-signing.pub
readonly SIGNATURE_SIZE=64
# npud.fastrpc.trust.shell.DEVELOPMENT_PUBLIC_KEY_HEX (a test keeps them equal): the
# key whose private half is in the repository, refused for a device.
readonly DEVELOPMENT_PUBLIC_KEY_HEX=e058d490c7ade196e48affcb26c314c9b7f069ab0ae2d8ed0f31fafb2b4e62cb

usage() {
    cat <<EOF
Usage: $PROG [OPTIONS]

Install npud's units, configuration and reference files.

Options:
  --root DIR         install below DIR instead of / (like DESTDIR; DIR must
                     exist). Nothing is activated. Env: NPUD_INSTALL_ROOT.
  --prefix DIR       where the vendor files go (default $DEFAULT_PREFIX; /usr/local
                     also works: systemd, udev and man search both). The
                     admin's files stay in /etc. Any other DIR is a staging
                     tree that systemd would not read: without --root,
                     everything then goes below DIR (the admin's files to
                     DIR/etc/npud, the shell's references to
                     DIR/lib/dsp/cdsp), nothing of the running system's
                     /etc is touched and nothing is activated.
  --dry-run          print what would change; write and run nothing
  --signing-dir DIR  install the shell's signature reference files from DIR:
                     $PUBLIC_KEY_NAME, $SHELL_NAME.sha256 and
                     $SHELL_NAME.sig, made with \`npud-sign-shell\` and your
                     own key. npud's development key is refused.
  --shell-image FILE check the .sha256 of --signing-dir against FILE instead of
                     the shell installed in $DSP_DIR
  --with-venv        also create $VENV_DIR and pip-install npud into it
                     (the running system only; needs python3 >= 3.11)
  --with-shim        also build npud's libcdsprpc (shim/, needs gcc, make and
                     libmsgpack-dev) and install it as
                     PREFIX/lib/npud/libcdsprpc.so.1 with the libcdsprpc.so
                     link llama.cpp loads (docs/llm.md). A directory of its
                     own, so Qualcomm's libcdsprpc stays what the loader finds
                     by default; programs meant for npud set LD_LIBRARY_PATH.
  --no-activate      on the running system, do not run systemd-sysusers,
                     systemd-tmpfiles, udevadm and systemctl
  -h, --help         show this help

Vendor files (below --root, under --prefix; replaced when they differ):
  PREFIX/lib/systemd/system/npud.service, npud.socket
  PREFIX/lib/sysusers.d/npud.conf, PREFIX/lib/tmpfiles.d/npud.conf
  PREFIX/lib/udev/rules.d/90-npud-fastrpc.rules
  PREFIX/share/man/man8/npud.8, man1/npuctl.1, man5/npud.toml.5
  PREFIX/share/bash-completion/completions/npud, npuctl
  PREFIX/share/npud/portal-npu.sh, PREFIX/share/doc/npud/deploy.md
The admin's files (below --root; never overwritten: when yours differs, the
shipped one is written beside it as FILE.new and the script says so):
  $CONFIG_DIR/npud.toml
  $CONFIG_DIR/$PUBLIC_KEY_NAME                (--signing-dir)
With --with-shim (replaced when they differ):
  PREFIX/lib/npud/libcdsprpc.so.1 (mode 0755), PREFIX/lib/npud/libcdsprpc.so
With the shell (replaced, like the shell itself):
  $DSP_DIR/$SHELL_NAME.sha256, .sig   (--signing-dir)
Mode 0644, owned by root when run as root. Copies an older install.sh put in
/etc/systemd/system, /etc/sysusers.d, /etc/tmpfiles.d or /etc/udev/rules.d
override the vendor files: an unchanged copy is removed, an edited one is
kept and named (move your changes to a drop-in: systemctl edit npud.service).

Exit status: 0 done (or nothing to do), $EXIT_ERROR error, $EXIT_USAGE bad usage.
EOF
}

root=${NPUD_INSTALL_ROOT:-/}
prefix=$DEFAULT_PREFIX
dry_run=0
activate=1
with_venv=0
with_shim=0
signing_dir=""
shell_image=""

while [[ $# -gt 0 ]]; do
    case $1 in
        --root) need_value "$@"; root=$2; shift 2 ;;
        --root=*) root=${1#*=}; shift ;;
        --prefix) need_value "$@"; prefix=$2; shift 2 ;;
        --prefix=*) prefix=${1#*=}; shift ;;
        --signing-dir) need_value "$@"; signing_dir=$2; shift 2 ;;
        --signing-dir=*) signing_dir=${1#*=}; shift ;;
        --shell-image) need_value "$@"; shell_image=$2; shift 2 ;;
        --shell-image=*) shell_image=${1#*=}; shift ;;
        --dry-run) dry_run=1; shift ;;
        --with-venv) with_venv=1; shift ;;
        --with-shim) with_shim=1; shift ;;
        --no-activate) activate=0; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage_error "unknown argument: $1" ;;
    esac
done

[[ -n $root ]] || usage_error "--root needs a value"
[[ $prefix == /* && $prefix != *//* && $prefix != */ ]] ||
    usage_error "--prefix must be an absolute path without a trailing slash: $prefix"
[[ $prefix != /etc && $prefix != /etc/* ]] ||
    usage_error "--prefix $prefix: /etc is the admin's; vendor files go under /usr (or /usr/local)"
[[ -d $root ]] || die "--root $root is not a directory"
root=$(cd -- "$root" && pwd -P)
live=0
[[ $root == / ]] && live=1
# A prefix systemd, udev and man do not search is a staging tree: on the
# running system, the admin's files and the shell's references go below it
# too, and nothing is activated, so that a trial run changes nothing outside it.
staged=0
config_dir=$CONFIG_DIR
dsp_dir=$DSP_DIR
if [[ $live == 1 && $prefix != /usr && $prefix != /usr/local ]]; then
    staged=1
    config_dir=$prefix$CONFIG_DIR
    dsp_dir=$prefix${DSP_DIR#/usr}
    [[ $with_venv == 0 ]] ||
        usage_error "--with-venv installs into the running system's $VENV_DIR; not with --prefix $prefix, a staging tree (use --prefix /usr or /usr/local)"
fi

if [[ $live == 1 && $staged == 0 && $dry_run == 0 && $EUID -ne 0 ]]; then
    die "installing into the running system needs root (or use --dry-run, or --root DIR)"
fi

owner=$(new_file_owner)

changes=0
pending_tmp=""
cleanup() {
    if [[ -n $pending_tmp ]]; then
        rm -f -- "$pending_tmp"
    fi
}
trap cleanup EXIT

# ensure_dir PATH MODE [keep]: PATH is a directory with MODE; with "keep", an
# existing directory (the admin's) keeps whatever mode it has.
ensure_dir() {
    local path=$1 mode=$2 keep=${3:-} dest
    dest=$(target "$path")
    if [[ -d $dest && ! -L $dest ]]; then
        if [[ -z $keep && $(stat -c '%a' -- "$dest") != "$mode" ]]; then
            if [[ $dry_run == 1 ]]; then
                note "would chmod $mode $path"
            else
                chmod "$mode" -- "$dest"
                report "chmod $mode" "$path"
            fi
            changes=$((changes + 1))
        fi
        return
    fi
    if [[ -e $dest || -L $dest ]]; then
        die "$dest exists and is not a directory"
    fi
    if [[ $dry_run == 1 ]]; then
        note "would create $path/"
    else
        mkdir -p -- "$dest"
        chmod "$mode" -- "$dest"
        report created "$path/"
    fi
    changes=$((changes + 1))
}

# install_file SRC PATH MODE: put SRC at PATH (absolute, below --root) with
# MODE unless it is already there. The copy goes to a temporary file in the
# same directory and is renamed over PATH, so a reader never sees half a file.
install_file() {
    local src=$1 path=$2 mode=$3 dest dir action tmp
    dest=$(target "$path")
    if [[ -e $dest || -L $dest ]]; then
        if [[ -L $dest || ! -f $dest ]]; then
            die "$dest exists and is not a regular file; move it away first"
        fi
        if cmp -s -- "$src" "$dest" && [[ $(stat -c '%a %u %g' -- "$dest") == "$mode $owner" ]]; then
            report unchanged "$path"
            return
        fi
        action=update
    else
        action=install
    fi
    changes=$((changes + 1))
    if [[ $dry_run == 1 ]]; then
        note "would $action $path (mode $mode)"
        return
    fi
    dir=$(dirname -- "$dest")
    mkdir -p -- "$dir"
    tmp=$(mktemp -- "$dir/.${dest##*/}.XXXXXX")
    pending_tmp=$tmp
    cp -- "$src" "$tmp"
    chmod "$mode" -- "$tmp"
    if [[ $EUID -eq 0 ]]; then
        chown 0:0 -- "$tmp"
    fi
    mv -f -- "$tmp" "$dest"
    pending_tmp=""
    report "${action/%e/}ed" "$path"
}

# install_link TARGET PATH: PATH is a symbolic link to TARGET (relative).
install_link() {
    local link_target=$1 path=$2 dest
    dest=$(target "$path")
    if [[ -L $dest && $(readlink -- "$dest") == "$link_target" ]]; then
        report unchanged "$path"
        return
    fi
    if [[ -e $dest && ! -L $dest ]]; then
        die "$dest exists and is not a symbolic link; move it away first"
    fi
    changes=$((changes + 1))
    if [[ $dry_run == 1 ]]; then
        note "would link $path -> $link_target"
        return
    fi
    mkdir -p -- "$(dirname -- "$dest")"
    ln -sfn -- "$link_target" "$dest"
    report linked "$path -> $link_target"
}

# install_conffile SRC PATH WHAT: like install_file, for a file of the admin's:
# a PATH that differs from SRC (edited, or another key) is never touched, and
# SRC goes next to it as PATH.new; WHAT says what to do with that.
install_conffile() {
    local src=$1 path=$2 what=$3 dest
    dest=$(target "$path")
    if [[ -e $dest || -L $dest ]] && ! { [[ -f $dest && ! -L $dest ]] && cmp -s -- "$src" "$dest"; }; then
        if [[ $dry_run == 1 ]]; then
            warn "would keep your $path; the shipped one would go to $path.new ($what)"
        else
            warn "kept your $path; the shipped one is $path.new ($what)"
        fi
        install_file "$src" "$path.new" 644
    elif [[ -e $dest ]]; then
        report unchanged "$path"  # the shipped content; its mode and owner are the admin's
    else
        install_file "$src" "$path" 644
    fi
}

# retire_legacy OLD NEW SRC: OLD is where an older install.sh put the vendor
# file now at NEW; a file in /etc overrides it. A copy equal to the shipped one
# is ours and goes; anything else is the admin's and stays, named.
retire_legacy() {
    local old=$1 new=$2 src=$3 dest
    dest=$(target "$old")
    [[ -e $dest || -L $dest ]] || return 0
    if [[ -f $dest && ! -L $dest ]] && cmp -s -- "$src" "$dest"; then
        changes=$((changes + 1))
        if [[ $dry_run == 1 ]]; then
            note "would remove $old: an unchanged copy that would override $new"
        else
            rm -f -- "$dest"
            report removed "$old (overrode $new)"
        fi
    else
        warn "$old overrides $new: an older install.sh's copy or your edit; kept. Put your changes in a drop-in (systemctl edit, or ${old%/*}/<name>.d/) and remove it"
    fi
}

source_file() {
    local path="$SOURCE_DIR/$1"
    [[ -f $path ]] || die "missing source file $path"
    printf '%s\n' "$path"
}

# --- Check everything before writing anything ----------------------------

# source|installed path|where an older install.sh put it (if it did)
declare -a plan=(
    "systemd/npud.service|$prefix/lib/systemd/system/npud.service|/etc/systemd/system/npud.service"
    "systemd/npud.socket|$prefix/lib/systemd/system/npud.socket|/etc/systemd/system/npud.socket"
    "systemd/sysusers.d/npud.conf|$prefix/lib/sysusers.d/npud.conf|/etc/sysusers.d/npud.conf"
    "systemd/tmpfiles.d/npud.conf|$prefix/lib/tmpfiles.d/npud.conf|/etc/tmpfiles.d/npud.conf"
    "systemd/udev/90-npud-fastrpc.rules|$prefix/lib/udev/rules.d/90-npud-fastrpc.rules|/etc/udev/rules.d/90-npud-fastrpc.rules"
    "man/npud.8|$prefix/share/man/man8/npud.8|"
    "man/npuctl.1|$prefix/share/man/man1/npuctl.1|"
    "man/npud.toml.5|$prefix/share/man/man5/npud.toml.5|"
    "completions/bash/npud|$prefix/share/bash-completion/completions/npud|"
    "completions/bash/npuctl|$prefix/share/bash-completion/completions/npuctl|"
    "config/portal-npu.sh|$prefix/share/npud/portal-npu.sh|"
    "docs/deploy.md|$prefix/share/doc/npud/deploy.md|"
)
for entry in "${plan[@]}"; do
    source_file "${entry%%|*}" >/dev/null
done
sysusers_conf=$prefix/lib/sysusers.d/npud.conf
tmpfiles_conf=$prefix/lib/tmpfiles.d/npud.conf
config_src=$(source_file config/npud.toml)

# key_hex FILE: the Ed25519 public key in FILE as 64 lower-case hex digits,
# from either form npud reads: hex digits, or PEM (a SubjectPublicKeyInfo
# whose DER ends in the 32 key bytes). Anything else prints as is.
key_hex() {
    if grep -q -- '-----BEGIN PUBLIC KEY-----' "$1"; then
        sed -n '/-----BEGIN PUBLIC KEY-----/,/-----END PUBLIC KEY-----/p' -- "$1" |
            sed '1d;$d' | base64 -d 2>/dev/null | od -An -v -tx1 | tr -d ' \n' | tail -c 64
    else
        tr -d ' \t\r\n' <"$1" | tr 'A-F' 'a-f'
    fi
}

check_signing_dir() {
    local dir=$1 name digest_line expected actual image
    [[ -d $dir ]] || die "--signing-dir $dir is not a directory"
    for name in "$PUBLIC_KEY_NAME" "$SHELL_NAME.sha256" "$SHELL_NAME.sig"; do
        [[ -f $dir/$name ]] || die "--signing-dir $dir has no $name (make it with npud-sign-shell)"
    done
    if [[ $(key_hex "$dir/$PUBLIC_KEY_NAME") == "$DEVELOPMENT_PUBLIC_KEY_HEX" ]]; then
        die "$dir/$PUBLIC_KEY_NAME is the development key, whose private half is public; make your own with 'npud-sign-shell genkey' (docs/deploy.md)"
    fi
    [[ $(stat -c '%s' -- "$dir/$SHELL_NAME.sig") == "$SIGNATURE_SIZE" ]] ||
        die "$dir/$SHELL_NAME.sig is not a $SIGNATURE_SIZE-byte Ed25519 signature"
    digest_line=$(head -n 1 -- "$dir/$SHELL_NAME.sha256")
    [[ $digest_line =~ ^([0-9a-fA-F]{64})([[:space:]]|$) ]] ||
        die "$dir/$SHELL_NAME.sha256 is not in sha256sum format"
    expected=${BASH_REMATCH[1],,}
    image=${shell_image:-$(target "$DSP_DIR/$SHELL_NAME")}
    if [[ -f $image ]]; then
        actual=$(hash_of "$image")
        [[ $actual == "$expected" ]] ||
            die "$dir/$SHELL_NAME.sha256 does not match $image; sign the shell you deploy (npud-sign-shell sign)"
    else
        warn "no shell at $image yet; its digest will be checked by npud when it starts"
    fi
}

if [[ -n $signing_dir ]]; then
    check_signing_dir "$signing_dir"
elif [[ -n $shell_image ]]; then
    usage_error "--shell-image only makes sense with --signing-dir"
fi

if [[ $with_venv == 1 ]]; then
    [[ $live == 1 ]] || die "--with-venv installs into $VENV_DIR of the running system; a venv cannot be moved, so it cannot go below --root"
    python=${PYTHON:-python3}
    command -v "$python" >/dev/null || die "$python not found (apt-get install python3 python3-venv)"
    "$python" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' ||
        die "$python must be Python 3.11 or newer with the venv module (apt-get install python3-venv)"
fi

shim_dir=""
if [[ $with_shim == 1 ]]; then
    for tool in make gcc; do
        command -v "$tool" >/dev/null || die "--with-shim needs $tool (apt-get install build-essential)"
    done
    shim_dir=$(mktemp -d)
    trap 'cleanup; rm -rf -- "$shim_dir"' EXIT
    make -s -C "$SOURCE_DIR/shim" OUT="$shim_dir" >&2 ||
        die "building the shim failed (it needs libmsgpack-dev: apt-get install libmsgpack-dev)"
fi

# --- Lay out the files ---------------------------------------------------

if [[ $dry_run == 1 ]]; then
    note "dry run: nothing will be written"
fi
if [[ $staged == 1 ]]; then
    note "staging into $prefix (not a prefix systemd searches): nothing outside it is written"
else
    note "installing from $SOURCE_DIR into $root"
fi

for entry in "${plan[@]}"; do
    IFS='|' read -r src path legacy <<<"$entry"
    install_file "$SOURCE_DIR/$src" "$path" 644
    # The legacy copies are the running system's /etc: a staging run leaves them be.
    if [[ -n $legacy && $staged == 0 ]]; then
        retire_legacy "$legacy" "$path" "$SOURCE_DIR/$src"
    fi
done
ensure_dir "$config_dir" 755 keep
install_conffile "$config_src" "$config_dir/npud.toml" "merge it into yours by hand"

if [[ -n $signing_dir ]]; then
    install_conffile "$signing_dir/$PUBLIC_KEY_NAME" "$config_dir/$PUBLIC_KEY_NAME" \
        "a different key: to change keys, move it over yours and restart npud"
    install_file "$signing_dir/$SHELL_NAME.sha256" "$dsp_dir/$SHELL_NAME.sha256" 644
    install_file "$signing_dir/$SHELL_NAME.sig" "$dsp_dir/$SHELL_NAME.sig" 644
else
    for path in "$config_dir/$PUBLIC_KEY_NAME" "$dsp_dir/$SHELL_NAME.sha256" "$dsp_dir/$SHELL_NAME.sig"; do
        [[ -f $(target "$path") ]] ||
            warn "$path is missing: npud refuses to load the shell without it (use --signing-dir)"
    done
fi

if [[ $with_shim == 1 ]]; then
    install_file "$shim_dir/libcdsprpc.so.1" "$prefix/lib/npud/libcdsprpc.so.1" 755
    install_link libcdsprpc.so.1 "$prefix/lib/npud/libcdsprpc.so"
fi

if [[ $with_venv == 1 ]]; then
    if [[ $dry_run == 1 ]]; then
        note "would create $VENV_DIR (if missing) and pip-install protocol/, client/ and npud into it"
    else
        [[ -x $VENV_DIR/bin/python ]] || "$python" -m venv -- "$VENV_DIR"
        "$VENV_DIR/bin/python" -m pip install --quiet --upgrade \
            "$SOURCE_DIR/protocol" "$SOURCE_DIR/client" "$SOURCE_DIR"
        note "installed npud into $VENV_DIR"
    fi
    changes=$((changes + 1))
elif [[ ! -x $(target "$VENV_DIR/bin/npud") ]]; then
    warn "$VENV_DIR/bin/npud does not exist; npud.service cannot start until it does (use --with-venv)"
fi

# --- Activate on the running system --------------------------------------

# run CMD...: run (or, in a dry run, show) one activation step. A step that
# fails is reported and the rest still run: each is idempotent and can be
# repeated by hand.
run() {
    if [[ $dry_run == 1 ]]; then
        note "would run: $*"
    elif "$@"; then
        note "ran: $*"
    else
        warn "failed: $* (run it by hand once the cause is fixed)"
    fi
}

if [[ $live == 0 ]]; then
    note "not activating: $root is not the running system"
elif [[ $staged == 1 ]]; then
    note "not activating: $prefix is a staging tree (systemd and udev search /usr and /usr/local)"
elif [[ $activate == 0 ]]; then
    note "not activating (--no-activate)"
else
    if command -v systemd-sysusers >/dev/null; then
        run systemd-sysusers "$sysusers_conf"
    else
        warn "systemd-sysusers not found: create the users by hand (docs/deploy.md)"
    fi
    if command -v systemd-tmpfiles >/dev/null; then
        run systemd-tmpfiles --create "$tmpfiles_conf"
    fi
    if command -v udevadm >/dev/null; then
        run udevadm control --reload
        run udevadm trigger --subsystem-match=misc --subsystem-match=remoteproc
    else
        warn "udevadm not found: the fastrpc device rule applies from the next boot"
    fi
    if [[ -d /run/systemd/system ]]; then
        run systemctl daemon-reload
        run systemctl enable --now npud.socket
    else
        warn "systemd is not running here: enable later with 'systemctl enable --now npud.socket'"
    fi
fi

if [[ $changes == 0 ]]; then
    note "nothing to change: every file is already in place"
elif [[ $dry_run == 1 ]]; then
    note "$changes change(s) would be made"
else
    note "$changes change(s) made"
fi
