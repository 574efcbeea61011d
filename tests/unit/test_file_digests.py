"""FileDigests: a model file's SHA-256 remembered by the file's identity, and never past a
change of the file."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from npud.domain import digests as digests_module
from npud.domain.digests import FileDigests

TICK = 0.05  # longer than any filesystem's timestamp granularity here


def opened(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY)
    try:
        yield fd
    finally:
        os.close(fd)


@pytest.fixture
def quiet_file(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A file whose last change is older than the digests' quiet time (TICK)."""
    path = tmp_path / "model.bin"
    path.write_bytes(b"weights" * 1000)
    time.sleep(TICK * 2)
    yield from ((path, fd) for fd in opened(path))


def test_the_same_file_is_hashed_once(quiet_file: tuple[Path, int]) -> None:
    path, fd = quiet_file
    digests = FileDigests(quiet_seconds=TICK)
    expected = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_size)
    os.lseek(fd, 5, os.SEEK_SET)
    assert digests.sha256(fd, path.stat().st_size) == expected
    assert digests.sha256(fd, path.stat().st_size) == expected
    assert (digests.misses, digests.hits, len(digests)) == (1, 1, 1)
    assert os.lseek(fd, 0, os.SEEK_CUR) == 5  # pread: the caller's offset stays


def test_a_prefix_is_its_own_entry(quiet_file: tuple[Path, int]) -> None:
    _, fd = quiet_file
    digests = FileDigests(quiet_seconds=TICK)
    assert digests.sha256(fd, 7) == (hashlib.sha256(b"weights").hexdigest(), 7)
    assert digests.sha256(fd, 14)[1] == 14
    assert digests.misses == 2


def test_a_write_after_the_digest_is_noticed(quiet_file: tuple[Path, int]) -> None:
    path, fd = quiet_file
    digests = FileDigests(quiet_seconds=TICK)
    size = path.stat().st_size
    first = digests.sha256(fd, size)
    with path.open("r+b") as writer:  # the same size, the same inode, other bytes
        writer.write(b"W")
    second = digests.sha256(fd, size)
    assert second != first
    assert second == (hashlib.sha256(path.read_bytes()).hexdigest(), size)


def test_mtime_set_back_does_not_hide_a_write(quiet_file: tuple[Path, int]) -> None:
    path, fd = quiet_file
    digests = FileDigests(quiet_seconds=TICK)
    size = path.stat().st_size
    before = path.stat()
    first = digests.sha256(fd, size)
    with path.open("r+b") as writer:
        writer.write(b"W")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # ctime cannot be set back
    assert digests.sha256(fd, size) != first


def test_a_file_changed_just_now_is_not_remembered(tmp_path: Path) -> None:
    path = tmp_path / "fresh.bin"
    path.write_bytes(b"fresh")
    digests = FileDigests(quiet_seconds=60)
    for fd in opened(path):
        digests.sha256(fd, 5)
        digests.sha256(fd, 5)
    assert (digests.misses, digests.hits, len(digests)) == (2, 0, 0)


def test_a_write_while_hashing_is_not_remembered(
    quiet_file: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, fd = quiet_file
    real = digests_module.sha256_of

    def written_meanwhile(fd: int, size: int) -> tuple[str, int]:
        answer = real(fd, size)
        with path.open("r+b") as writer:
            writer.write(b"W")
        return answer

    monkeypatch.setattr(digests_module, "sha256_of", written_meanwhile)
    digests = FileDigests(quiet_seconds=TICK)
    digests.sha256(fd, 7)
    assert len(digests) == 0


def test_a_file_that_shrank_reports_what_was_read(quiet_file: tuple[Path, int]) -> None:
    path, fd = quiet_file
    assert FileDigests(quiet_seconds=TICK).sha256(fd, 1 << 20) == (
        hashlib.sha256(path.read_bytes()).hexdigest(),
        path.stat().st_size,
    )


def test_the_table_is_bounded_least_recently_used_out(tmp_path: Path) -> None:
    paths = [tmp_path / f"{index}.bin" for index in range(3)]
    for index, path in enumerate(paths):
        path.write_bytes(bytes([index]) * 10)
    time.sleep(TICK * 2)
    digests = FileDigests(entries=2, quiet_seconds=TICK)
    fds = [os.open(path, os.O_RDONLY) for path in paths]
    try:
        digests.sha256(fds[0], 10)
        digests.sha256(fds[1], 10)
        digests.sha256(fds[0], 10)  # 0 is the most recent now
        digests.sha256(fds[2], 10)  # 1 goes
        assert len(digests) == 2
        digests.sha256(fds[0], 10)
        assert digests.hits == 2
        digests.sha256(fds[1], 10)
        assert digests.misses == 4
    finally:
        for fd in fds:
            os.close(fd)


def test_clear_forgets(quiet_file: tuple[Path, int]) -> None:
    _, fd = quiet_file
    digests = FileDigests(quiet_seconds=TICK)
    digests.sha256(fd, 7)
    digests.clear()
    assert len(digests) == 0


def test_an_unreadable_descriptor_raises(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "w.bin", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError, match="Bad file descriptor"):
            FileDigests().sha256(fd, 10)
    finally:
        os.close(fd)
