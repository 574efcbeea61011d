"""Reading the CDSP firmware version, and the tables doctor shares with the scripts."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from npud.ops.doctor_checks import (
    DEFAULT_QAIRT_ROOT,
    DSP_SKEL_LIBRARY,
    KNOWN_BAD_FIRMWARE,
    KNOWN_GOOD_FIRMWARE,
    QAIRT_HOST_LIBRARIES,
    Status,
    firmware_verdict,
    read_firmware_version,
)
from tests.doctor.fake_tree import firmware_image

REPO = Path(__file__).resolve().parents[2]


def test_finds_the_version_in_an_image() -> None:
    image = firmware_image(KNOWN_GOOD_FIRMWARE)
    assert read_firmware_version(io.BytesIO(image)) == KNOWN_GOOD_FIRMWARE


def test_no_version_string() -> None:
    assert read_firmware_version(io.BytesIO(firmware_image(None))) is None
    assert read_firmware_version(io.BytesIO(b"")) is None


def test_only_cdsp_versions_count_and_the_first_wins() -> None:
    data = (
        b"QC_IMAGE_VERSION_STRING=ADSP.HT.5.5\0"
        b"QC_IMAGE_VERSION_STRING=CDSP.HT.2.9.c1-00046-HAMOA-1\0"
        b"QC_IMAGE_VERSION_STRING=CDSP.HT.9.9\0"
    )
    assert read_firmware_version(io.BytesIO(data)) == "CDSP.HT.2.9.c1-00046-HAMOA-1"


def test_version_at_the_very_end() -> None:
    data = b"junk" * 10 + b"QC_IMAGE_VERSION_STRING=CDSP.HT.2.9.c1-00046-HAMOA-1"
    for chunk_size in (24, 30, 47, 4096):
        assert read_firmware_version(io.BytesIO(data), chunk_size) == KNOWN_GOOD_FIRMWARE


def test_version_across_every_chunk_boundary() -> None:
    image = firmware_image(KNOWN_GOOD_FIRMWARE, padding=100)
    for chunk_size in range(24, 120):
        assert read_firmware_version(io.BytesIO(image), chunk_size) == KNOWN_GOOD_FIRMWARE


def test_chunks_shorter_than_the_prefix_are_refused() -> None:
    with pytest.raises(ValueError, match="chunk_size must be at least 24"):
        read_firmware_version(io.BytesIO(b""), 8)


@pytest.mark.parametrize(
    ("version", "status"),
    [
        (KNOWN_GOOD_FIRMWARE, Status.OK),
        ("CDSP.HT.2.9.c2-00051-HAMOA-1", Status.FAIL),
        ("CDSP.HT.2.9.c2-00051-OTHER-7", Status.FAIL),
        ("CDSP.HT.2.9.c1-00069-HAMOA-1", Status.FAIL),
        ("CDSP.HT.2.9.c1-00046-HAMOA-2", Status.WARN),
        ("CDSP.HT.2.9.c2-000510-HAMOA-1", Status.WARN),
    ],
)
def test_verdicts(version: str, status: Status) -> None:
    assert firmware_verdict(version)[0] is status


def test_firmware_table_matches_deploy_npu_sh() -> None:
    script = (REPO / "scripts" / "deploy_npu.sh").read_text()
    good = re.search(r"^readonly KNOWN_GOOD_FIRMWARE=(\S+)$", script, re.MULTILINE)
    assert good is not None
    assert good.group(1) == KNOWN_GOOD_FIRMWARE
    table = re.search(r"^readonly -a KNOWN_BAD_FIRMWARE=\(\n(.*?)^\)", script, re.M | re.S)
    assert table is not None
    entries = re.findall(r'^\s+"([^"|]+)\|([^"]+)"$', table.group(1), re.MULTILINE)
    assert tuple(entries) == KNOWN_BAD_FIRMWARE


def test_library_names_match_portal_npu_sh_and_the_deploy_doc() -> None:
    portal = (REPO / "config" / "portal-npu.sh").read_text()
    assert f': "${{QAIRT_ROOT:={DEFAULT_QAIRT_ROOT}}}"' in portal
    assert '"$QAIRT_ROOT/lib"' in portal
    for name in QAIRT_HOST_LIBRARIES:
        assert name in portal
    assert DSP_SKEL_LIBRARY in portal
    deploy = (REPO / "docs" / "deploy.md").read_text()
    assert f"{DEFAULT_QAIRT_ROOT}/lib/" in deploy
    assert DSP_SKEL_LIBRARY in deploy
