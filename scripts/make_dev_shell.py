#!/usr/bin/env python3
"""Regenerate the DEVELOPMENT shell in npud/devshell/ and sign it with the development key.

Writes ``fastrpc_shell_unsigned_3`` (an ELF32 header for EM_QDSP6 plus a note
saying what the file is; no code), its ``.sha256`` and its ``.sig``. Ed25519
signatures are deterministic, so the output is the same byte for byte on
every run, and a test checks the committed files against it.

    python scripts/make_dev_shell.py              # rewrite npud/devshell/
    python scripts/make_dev_shell.py --check      # exit 1 if npud/devshell/ is stale
    python scripts/make_dev_shell.py --output-dir DIR
"""

from __future__ import annotations

import argparse
import struct
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from npud.fastrpc.trust.shell import is_development_key
from npud.ops.sign_shell import SignError, load_private_key_file, sign_shell_file, write_file_atomic

DEV_DIR: Final = Path(__file__).resolve().parent.parent / "npud" / "devshell"
SHELL_NAME: Final = "fastrpc_shell_unsigned_3"
DEVELOPMENT_KEY: Final = DEV_DIR / "DEVELOPMENT-ONLY-shell-signing.key"

NOTE_TEXT: Final = (
    "npud DEVELOPMENT shell for the emulator (EmulatedDriver).\n"
    "This is NOT a Hexagon DSP image: an ELF header and this note, no code.\n"
    "It is signed with the development key in npud/devshell/ of the npud repository.\n"
    "That key is public; the kernel profile refuses it. Never install this on a device.\n"
)

# ELF constants (System V gABI; EM_QDSP6 from elf.h).
_ELFCLASS32: Final = 1
_ELFDATA2LSB: Final = 1
_EV_CURRENT: Final = 1
_ET_EXEC: Final = 2
_EM_QDSP6: Final = 164
_PT_NOTE: Final = 4
_PF_R: Final = 4
_EHDR: Final = struct.Struct("<16sHHIIIIIHHHHHH")  # Elf32_Ehdr, 52 bytes
_PHDR: Final = struct.Struct("<IIIIIIII")  # Elf32_Phdr, 32 bytes
_SHDR_SIZE: Final = 40  # sizeof(Elf32_Shdr); no section headers, but e_shentsize says it
_NOTE_NAME: Final = b"npud\0"
_NOTE_TYPE: Final = 1


def _pad4(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def build_dev_shell_image() -> bytes:
    """The development shell: ELF header, one PT_NOTE program header, the note."""
    desc = NOTE_TEXT.encode("ascii")
    note = (
        struct.pack("<III", len(_NOTE_NAME), len(desc), _NOTE_TYPE)
        + _pad4(_NOTE_NAME)
        + _pad4(desc)
    )
    note_offset = _EHDR.size + _PHDR.size
    ident = bytes([0x7F, *b"ELF", _ELFCLASS32, _ELFDATA2LSB, _EV_CURRENT]).ljust(16, b"\0")
    ehdr = _EHDR.pack(
        ident,
        _ET_EXEC,
        _EM_QDSP6,
        _EV_CURRENT,
        0,  # e_entry: nothing to run
        _EHDR.size,  # e_phoff
        0,  # e_shoff: no section headers
        0,  # e_flags: no Hexagon architecture is claimed
        _EHDR.size,
        _PHDR.size,
        1,  # e_phnum
        _SHDR_SIZE,
        0,  # e_shnum
        0,  # e_shstrndx (SHN_UNDEF)
    )
    phdr = _PHDR.pack(_PT_NOTE, note_offset, 0, 0, len(note), len(note), _PF_R, 4)
    return ehdr + phdr + note


def write_dev_shell(output_dir: Path) -> list[Path]:
    """Write the shell and sign it with the development key; return the three paths."""
    key = load_private_key_file(DEVELOPMENT_KEY)
    if not is_development_key(key.public_key()):
        raise SignError(
            f"{DEVELOPMENT_KEY} is not the development key that npud.fastrpc.trust.shell names "
            "(DEVELOPMENT_PUBLIC_KEY_HEX); update both together"
        )
    shell = output_dir / SHELL_NAME
    write_file_atomic(shell, build_dev_shell_image(), 0o644)
    signed = sign_shell_file(shell, key)
    return [shell, Path(signed.digest_path), Path(signed.signature_path)]


def _stale_files(committed_dir: Path) -> list[str]:
    with tempfile.TemporaryDirectory() as scratch:
        fresh = write_dev_shell(Path(scratch))
        stale = []
        for path in fresh:
            committed = committed_dir / path.name
            if not committed.is_file() or committed.read_bytes() != path.read_bytes():
                stale.append(str(committed))
        return stale


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--output-dir", type=Path, default=DEV_DIR, help="where to write (default npud/devshell)"
    )
    parser.add_argument(
        "--check", action="store_true", help="compare with --output-dir instead of writing"
    )
    args = parser.parse_args(argv)
    output_dir: Path = args.output_dir
    try:
        if args.check:
            stale = _stale_files(output_dir)
            for name in stale:
                print(f"stale: {name} (run scripts/make_dev_shell.py)", file=sys.stderr)
            return 1 if stale else 0
        for path in write_dev_shell(output_dir):
            print(f"wrote {path}")
    except (SignError, OSError) as exc:
        print(f"make_dev_shell: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
