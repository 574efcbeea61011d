#!/usr/bin/env bash
# Restore the NPU's software from a snapshot tarball: the CDSP firmware, the
# DSP libraries and the QAIRT runtime; keep the CDSP out of runtime power
# management; install npud's units (scripts/install.sh).
#
# Nothing is written until the whole snapshot has been checked: every file
# against SHA256SUMS, every path against the places a snapshot may restore,
# the firmware version against the known-bad ones. A second run with the same
# snapshot changes nothing and says so. docs/deploy.md describes the snapshot
# format and the procedure.
set -euo pipefail
umask 022

readonly PROG=deploy_npu.sh
SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
readonly SCRIPT_DIR
# die, usage_error, note, warn, report, need_value, target, hash_of; EXIT_ERROR, EXIT_USAGE.
# shellcheck source=scripts/install-lib.sh
. "$SCRIPT_DIR/install-lib.sh"

readonly KNOWN_GOOD_FIRMWARE=CDSP.HT.2.9.c1-00046-HAMOA-1
# version glob|why it must not be deployed
readonly -a KNOWN_BAD_FIRMWARE=(
    "CDSP.HT.2.9.c2-00051-*|rejects unsigned modules with 0x80000A1A"
    "CDSP.HT.2.9.c1-00069-*|is rejected by TrustZone"
)
# Where a snapshot may put files, relative to the install root. Anything else
# in a snapshot is refused rather than written over the system.
readonly -a ALLOWED_PREFIXES=(
    usr/lib/firmware/qcom/
    lib/firmware/qcom/
    usr/lib/dsp/
    opt/qcom/qairt/
)
readonly MANIFEST=SHA256SUMS
readonly PAYLOAD=root

# Exit statuses (also in --help), beyond install-lib.sh's EXIT_ERROR and EXIT_USAGE.
# sysexits.h: EX_DATAERR (the snapshot's contents), EX_UNAVAILABLE (firmware npud cannot use).
readonly EXIT_REFUSED=65 EXIT_BAD_FIRMWARE=69

usage() {
    cat <<EOF
Usage: $PROG [OPTIONS] SNAPSHOT.tar[.gz|.xz|.zst]

Restore the CDSP firmware, DSP libraries and QAIRT runtime from SNAPSHOT,
disable runtime PM for the CDSP, and install npud's units.

The snapshot holds $MANIFEST (sha256sum lines for every file) and a
directory $PAYLOAD/ mirroring the file system; only these may be restored:
$(printf '  /%s\n' "${ALLOWED_PREFIXES[@]}")
A SNAPSHOT.sha256 file beside the tarball, if present, is checked first.

Options:
  --dry-run          check the snapshot and show what would change; write nothing
  --force            deploy a firmware version known to be bad, or one whose
                     version cannot be read
  --root DIR         install root (default /).        Env: NPUD_INSTALL_ROOT
  --sysfs DIR        sysfs root (default /sys).       Env: NPUD_SYSFS_ROOT
  --backup-dir DIR   where files about to be replaced are saved as a snapshot
                     of the same format (default ROOT/var/backups/npud)
  --signing-dir DIR  passed to install.sh: the shell's .sha256/.sig and public key
  --with-venv        passed to install.sh: install npud itself into /opt/npud/venv
  --no-units         do not run install.sh
  --no-activate      passed to install.sh: do not touch the running systemd/udev
  -h, --help         show this help

Firmware: $KNOWN_GOOD_FIRMWARE is known to work. Refused without --force:
$(for bad in "${KNOWN_BAD_FIRMWARE[@]}"; do printf '  %s %s\n' "${bad%%|*}" "${bad#*|}"; done)

Exit status: 0 done or nothing to do, $EXIT_ERROR error, $EXIT_USAGE bad usage,
$EXIT_REFUSED snapshot refused (checksums, content), $EXIT_BAD_FIRMWARE known-bad firmware.
Nothing is written when the status is $EXIT_USAGE, $EXIT_REFUSED or $EXIT_BAD_FIRMWARE.
EOF
}

refuse() {
    printf '%s: refused: %s\nNothing was written.\n' "$PROG" "$*" >&2
    exit "$EXIT_REFUSED"
}

root=${NPUD_INSTALL_ROOT:-/}
sysfs=${NPUD_SYSFS_ROOT:-/sys}
backup_dir=""
signing_dir=""
dry_run=0
force=0
units=1
activate=1
with_venv=0
snapshot=""

while [[ $# -gt 0 ]]; do
    case $1 in
        --root) need_value "$@"; root=$2; shift 2 ;;
        --root=*) root=${1#*=}; shift ;;
        --sysfs) need_value "$@"; sysfs=$2; shift 2 ;;
        --sysfs=*) sysfs=${1#*=}; shift ;;
        --backup-dir) need_value "$@"; backup_dir=$2; shift 2 ;;
        --backup-dir=*) backup_dir=${1#*=}; shift ;;
        --signing-dir) need_value "$@"; signing_dir=$2; shift 2 ;;
        --signing-dir=*) signing_dir=${1#*=}; shift ;;
        --dry-run) dry_run=1; shift ;;
        --force) force=1; shift ;;
        --no-units) units=0; shift ;;
        --with-venv) with_venv=1; shift ;;
        --no-activate) activate=0; shift ;;
        -h | --help) usage; exit 0 ;;
        --) shift; break ;;
        -*) usage_error "unknown option: $1" ;;
        *)
            [[ -z $snapshot ]] || usage_error "one snapshot at a time (got $snapshot and $1)"
            snapshot=$1
            shift
            ;;
    esac
done
if [[ $# -gt 0 ]]; then
    [[ -z $snapshot && $# -eq 1 ]] || usage_error "one snapshot at a time"
    snapshot=$1
fi
[[ -n $snapshot ]] || usage_error "no snapshot given"
[[ -f $snapshot ]] || usage_error "snapshot $snapshot is not a file"
[[ -n $root && -d $root ]] || usage_error "--root ${root:-''} is not a directory"
root=$(cd -- "$root" && pwd -P)
[[ -n $sysfs ]] || usage_error "--sysfs needs a value"
if [[ -d $sysfs ]]; then
    sysfs=$(cd -- "$sysfs" && pwd -P)
fi
live=0
[[ $root == / ]] && live=1
if [[ -z $backup_dir ]]; then
    backup_dir=${root%/}/var/backups/npud
fi

if [[ $live == 1 && $dry_run == 0 && $EUID -ne 0 ]]; then
    die "deploying onto the running system needs root (or use --dry-run, or --root DIR)"
fi
for tool in tar sha256sum cmp stat find mktemp; do
    command -v "$tool" >/dev/null || die "$tool not found"
done

staging=$(mktemp -d -- "${TMPDIR:-/tmp}/npud-deploy.XXXXXX")
pending_tmp=""
cleanup() {
    if [[ -n $pending_tmp ]]; then
        rm -f -- "$pending_tmp"
    fi
    rm -rf -- "$staging"
}
trap cleanup EXIT

# --- 1. Check the snapshot (writes only to the private staging directory) --

beside="$snapshot.sha256"
if [[ -f $beside ]]; then
    [[ $(head -n 1 -- "$beside") =~ ^([0-9a-fA-F]{64})([[:space:]]|$) ]] ||
        refuse "$beside is not in sha256sum format"
    [[ $(hash_of "$snapshot") == "${BASH_REMATCH[1],,}" ]] ||
        refuse "$snapshot does not match $beside (damaged or replaced tarball)"
    note "tarball matches $beside"
fi

# Members are checked before extraction: relative names without "..", only
# the manifest and the payload, and only regular files and directories (a
# link could point the extraction outside the staging directory). -P lists
# names exactly as stored instead of tar's own cleaned-up version.
if ! members=$(tar -tPf "$snapshot" 2>"$staging/tar.err"); then
    refuse "cannot read $snapshot as a tar archive: $(head -n 3 -- "$staging/tar.err")"
fi
while IFS= read -r member; do
    name=${member#./}
    if [[ $member == /* || /$name/ == */../* ]]; then
        refuse "unsafe path in snapshot: $member"
    fi
    case $name in
        "$MANIFEST" | "$PAYLOAD" | "$PAYLOAD/" | "$PAYLOAD"/* | "" | .) ;;
        *) refuse "unexpected member $member (a snapshot holds $MANIFEST and $PAYLOAD/ only)" ;;
    esac
done <<<"$members"
listing=$(tar -tvPf "$snapshot" 2>"$staging/tar.err")
while IFS= read -r entry; do
    case ${entry:0:1} in
        - | d) ;;
        *) refuse "snapshot member is not a regular file or directory: $entry" ;;
    esac
done <<<"$listing"
rm -f -- "$staging/tar.err"

tar -xf "$snapshot" -C "$staging" --no-same-owner --no-same-permissions ||
    refuse "cannot extract $snapshot"

odd=$(find "$staging" -mindepth 1 ! -type f ! -type d -printf '%P\n' | head -n 5)
[[ -z $odd ]] || refuse "snapshot holds something other than files and directories: $odd"
[[ -f $staging/$MANIFEST ]] || refuse "no $MANIFEST in $snapshot"
[[ -d $staging/$PAYLOAD ]] || refuse "no $PAYLOAD/ directory in $snapshot"

# Parse the manifest: every line "<64 hex> <space><space or *><path>", every
# path once, under the payload, inside an allowed prefix.
declare -A listed=()
declare -a files=()
lineno=0
while IFS= read -r line || [[ -n $line ]]; do
    lineno=$((lineno + 1))
    [[ -n $line ]] || continue
    [[ $line =~ ^([0-9a-fA-F]{64})\ [\ *](.+)$ ]] ||
        refuse "$MANIFEST line $lineno is not a sha256sum line"
    digest=${BASH_REMATCH[1],,}
    path=${BASH_REMATCH[2]#./}
    [[ $path == "$PAYLOAD"/* && /$path/ != */../* ]] ||
        refuse "$MANIFEST line $lineno: $path is not below $PAYLOAD/"
    [[ -z ${listed[$path]+set} ]] || refuse "$MANIFEST lists $path twice"
    relative=${path#"$PAYLOAD"/}
    allowed=0
    for prefix in "${ALLOWED_PREFIXES[@]}"; do
        if [[ $relative == "$prefix"* ]]; then
            allowed=1
        fi
    done
    [[ $allowed == 1 ]] || refuse "$path would go to /$relative, outside what a snapshot may restore"
    [[ -f $staging/$path ]] || refuse "$MANIFEST lists $path, which the snapshot does not contain"
    listed[$path]=$digest
    files+=("$path")
done <"$staging/$MANIFEST"
[[ ${#files[@]} -gt 0 ]] || refuse "$MANIFEST lists no files"

while IFS= read -r -d '' found; do
    path=${found#"$staging"/}
    [[ -n ${listed[$path]+set} ]] || refuse "$path is in the snapshot but not in $MANIFEST"
done < <(find "$staging/$PAYLOAD" -type f -print0)

mismatches=()
for path in "${files[@]}"; do
    [[ $(hash_of "$staging/$path") == "${listed[$path]}" ]] || mismatches+=("$path")
done
if [[ ${#mismatches[@]} -gt 0 ]]; then
    refuse "checksum mismatch: ${mismatches[*]}"
fi
note "checksums: ${#files[@]} file(s) match $MANIFEST"

# The firmware version is the QC_IMAGE_VERSION_STRING that Qualcomm builds
# embed in the image, read from the file itself rather than from a label.
firmware_version() {
    local file=$1 reader=(cat --)
    case $file in
        *.xz) reader=(xz -dc --) ;;
        *.zst) reader=(zstd -dcq --) ;;
    esac
    "${reader[@]}" "$file" 2>/dev/null |
        grep -a -o -m 1 'QC_IMAGE_VERSION_STRING=CDSP[A-Za-z0-9._-]*' |
        head -n 1 | sed 's/^QC_IMAGE_VERSION_STRING=//' || true
}

firmware_changes=0
for path in "${files[@]}"; do
    relative=${path#"$PAYLOAD"/}
    [[ $relative == usr/lib/firmware/* || $relative == lib/firmware/* ]] || continue
    base=${relative##*/}
    [[ $base == *cdsp*.mbn* && $base != *dtb* ]] || continue
    version=$(firmware_version "$staging/$path")
    if [[ -z $version ]]; then
        if [[ $force == 1 ]]; then
            warn "cannot read the firmware version of /$relative; deploying it anyway (--force)"
            continue
        fi
        printf '%s: refused: cannot read the firmware version of /%s (no QC_IMAGE_VERSION_STRING); --force deploys it anyway\nNothing was written.\n' \
            "$PROG" "$relative" >&2
        exit "$EXIT_BAD_FIRMWARE"
    fi
    verdict="unknown"
    reason=""
    if [[ $version == "$KNOWN_GOOD_FIRMWARE" ]]; then
        verdict="known good"
    else
        for bad in "${KNOWN_BAD_FIRMWARE[@]}"; do
            # shellcheck disable=SC2053  # the glob on the right is the point
            if [[ $version == ${bad%%|*} ]]; then
                verdict="known bad"
                reason=${bad#*|}
            fi
        done
    fi
    case $verdict in
        "known good") note "firmware /$relative: $version (known good)" ;;
        "known bad")
            if [[ $force == 1 ]]; then
                warn "firmware /$relative: $version $reason; deploying it anyway (--force)"
            else
                printf '%s: refused: firmware /%s is %s, which %s.\nUse a snapshot with %s, or --force.\nNothing was written.\n' \
                    "$PROG" "$relative" "$version" "$reason" "$KNOWN_GOOD_FIRMWARE" >&2
                exit "$EXIT_BAD_FIRMWARE"
            fi
            ;;
        *) warn "firmware /$relative: $version is not one npud has been checked with (known good: $KNOWN_GOOD_FIRMWARE)" ;;
    esac
done

# --- 2. Plan: compare with what is installed ------------------------------

owner=$(new_file_owner)

# Executables keep their x bit (QAIRT's tools); everything else is 0644.
mode_for() {
    if [[ -x $1 ]]; then
        printf '755\n'
    else
        printf '644\n'
    fi
}

declare -a to_write=()
declare -a to_backup=()
declare -a to_add=()
for path in "${files[@]}"; do
    relative=${path#"$PAYLOAD"/}
    dest=$(target "/$relative")
    mode=$(mode_for "$staging/$path")
    if [[ -L $dest || (-e $dest && ! -f $dest) ]]; then
        refuse "$dest exists and is not a regular file; move it away first"
    elif [[ ! -e $dest ]]; then
        report new "/$relative"
        to_add+=("$relative")
    elif [[ $(hash_of "$dest") != "${listed[$path]}" ]]; then
        report changed "/$relative"
        to_backup+=("$relative")
    elif [[ $(stat -c '%a %u %g' -- "$dest") != "$mode $owner" ]]; then
        report "mode" "/$relative (now $(stat -c '%a %u:%g' -- "$dest"), will be $mode)"
    else
        continue
    fi
    to_write+=("$path")
    if [[ $relative == *firmware/* ]]; then
        firmware_changes=$((firmware_changes + 1))
    fi
done
if [[ ${#to_write[@]} -eq 0 ]]; then
    note "snapshot: nothing to change (${#files[@]} file(s) already in place)"
fi

# The CDSP's remoteproc: named "cdsp" by recent kernels, after its platform
# device by older ones, where only its firmware name says cdsp.
find_cdsp_remoteprocs() {
    local dir name firmware
    for dir in "$sysfs"/class/remoteproc/remoteproc*; do
        [[ -d $dir ]] || continue
        name=$(cat -- "$dir/name" 2>/dev/null || true)
        firmware=$(cat -- "$dir/firmware" 2>/dev/null || true)
        if [[ $name == cdsp || $firmware == *cdsp* ]]; then
            printf '%s\n' "$dir"
        fi
    done
}

mapfile -t remoteprocs < <(find_cdsp_remoteprocs)

# install.sh's arguments. Its own checks (the signing files, the development
# key, --with-venv) run first as a dry run, so that a problem there also stops
# the deployment before anything is written.
install_args=(--root "$root")
if [[ -n $signing_dir ]]; then
    install_args+=(--signing-dir "$signing_dir")
fi
if [[ $with_venv == 1 ]]; then
    install_args+=(--with-venv)
fi
preflight_args=("${install_args[@]}" --dry-run)
shell_path="$PAYLOAD/usr/lib/dsp/cdsp/fastrpc_shell_unsigned_3"
if [[ -n $signing_dir && -n ${listed[$shell_path]+set} ]]; then
    # Check the signature files against the shell being deployed.
    preflight_args+=(--shell-image "$staging/$shell_path")
fi
if [[ $units == 1 && $dry_run == 0 ]]; then
    if ! preflight=$("$SCRIPT_DIR/install.sh" "${preflight_args[@]}" 2>&1); then
        printf '%s
' "$preflight" >&2
        refuse "install.sh would fail (above)"
    fi
fi

# set_runtime_pm_on DIR: keep the remoteproc powered instead of letting
# runtime PM suspend it, as the hardware notes require for the CDSP. The udev
# rule re-applies it at every boot; this makes it true now.
pm_changes=0
set_runtime_pm_on() {
    local control_file="$1/power/control" control
    if [[ ! -e $control_file ]]; then
        warn "$control_file does not exist; runtime PM cannot be changed"
        return
    fi
    control=$(cat -- "$control_file")
    if [[ $control == on ]]; then
        report unchanged "$control_file (runtime PM already off)"
    elif [[ $dry_run == 1 ]]; then
        note "would write \"on\" to $control_file (now \"$control\")"
    else
        printf 'on\n' >"$control_file" || die "cannot write $control_file"
        report written "$control_file: on (was \"$control\")"
        pm_changes=$((pm_changes + 1))
    fi
}

if [[ $dry_run == 1 ]]; then
    note "dry run: ${#to_write[@]} file(s) would be written; nothing was written"
    for dir in "${remoteprocs[@]}"; do
        set_runtime_pm_on "$dir"
    done
    if [[ ${#remoteprocs[@]} -eq 0 ]]; then
        warn "no CDSP remoteproc under $sysfs/class/remoteproc"
    fi
    if [[ $units == 1 ]]; then
        "$SCRIPT_DIR/install.sh" "${preflight_args[@]}"
    fi
    exit 0
fi

# --- 3. Write --------------------------------------------------------------

# Save what is about to be replaced as a snapshot of the same format, so that
# rolling back is deploying it, and list the files that are new, so that
# rolling back can remove them.
stamp=$(date -u +%Y%m%dT%H%M%SZ)
if [[ ${#to_add[@]} -gt 0 ]]; then
    mkdir -p -- "$backup_dir"
    added_list=$(mktemp --suffix=.txt -- "$backup_dir/npu-added-$stamp.XXXXXX")
    printf '/%s\n' "${to_add[@]}" >"$added_list"
    note "listed the ${#to_add[@]} new file(s) in $added_list (remove them to roll back)"
fi
if [[ ${#to_backup[@]} -gt 0 ]]; then
    backup_tree="$staging/backup"
    mkdir -p -- "$backup_tree/$PAYLOAD"
    for relative in "${to_backup[@]}"; do
        mkdir -p -- "$(dirname -- "$backup_tree/$PAYLOAD/$relative")"
        cp -p -- "$(target "/$relative")" "$backup_tree/$PAYLOAD/$relative"
    done
    (cd -- "$backup_tree" && find "$PAYLOAD" -type f -print0 | sort -z | xargs -0 sha256sum >"$MANIFEST")
    mkdir -p -- "$backup_dir"
    backup_file=$(mktemp --suffix=.tar.gz -- "$backup_dir/npu-before-$stamp.XXXXXX")
    tar -czf "$backup_file" -C "$backup_tree" "$MANIFEST" "$PAYLOAD"
    note "saved the ${#to_backup[@]} file(s) being replaced to $backup_file (deploy it to roll back)"
fi

for path in "${to_write[@]}"; do
    relative=${path#"$PAYLOAD"/}
    dest=$(target "/$relative")
    dir=$(dirname -- "$dest")
    mkdir -p -- "$dir"
    tmp=$(mktemp -- "$dir/.${dest##*/}.XXXXXX")
    pending_tmp=$tmp
    cp -- "$staging/$path" "$tmp"
    chmod "$(mode_for "$staging/$path")" -- "$tmp"
    if [[ $EUID -eq 0 ]]; then
        chown 0:0 -- "$tmp"
    fi
    # Renamed over the old file: a process that has the old library mapped
    # keeps the old inode instead of seeing its pages change under it.
    mv -f -- "$tmp" "$dest"
    pending_tmp=""
    report written "/$relative"
done

for dir in "${remoteprocs[@]}"; do
    set_runtime_pm_on "$dir"
done
if [[ ${#remoteprocs[@]} -eq 0 ]]; then
    warn "no CDSP remoteproc under $sysfs/class/remoteproc; runtime PM not changed (the udev rule sets it when the CDSP appears)"
fi

if [[ $units == 1 ]]; then
    if [[ $activate == 0 ]]; then
        install_args+=(--no-activate)
    fi
    "$SCRIPT_DIR/install.sh" "${install_args[@]}"
fi

if [[ ${#to_write[@]} -eq 0 && $pm_changes -eq 0 ]]; then
    note "done: snapshot and runtime PM: nothing changed"
else
    note "done: ${#to_write[@]} file(s) written, runtime PM set on $pm_changes remoteproc(s)"
fi
if [[ $firmware_changes -gt 0 ]]; then
    note "the CDSP firmware changed: reboot to load it (docs/deploy.md, step 5)"
fi
