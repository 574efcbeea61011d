"""DMA-BUF sizing: the crate's property tests on page rounding, and the size checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npu_protocol import MAX_BUFFER_SIZE, MAX_DMA_SIZE, ErrorCode
from npud.fastrpc.kernel.dma import PAGE_SIZE, checked_dma_size, page_round_up
from npud.fastrpc.kernel.errors import RpcError

U64_MAX = 2**64 - 1


@given(size=st.integers(0, U64_MAX - PAGE_SIZE + 1))
def test_page_rounding_is_a_page_multiple_never_smaller_and_less_than_a_page_more(
    size: int,
) -> None:
    rounded = page_round_up(size)
    assert rounded % PAGE_SIZE == 0
    assert rounded >= size
    assert rounded - size < PAGE_SIZE


@given(size=st.integers(U64_MAX - PAGE_SIZE + 2, U64_MAX))
def test_page_rounding_past_u64_is_an_overflow(size: int) -> None:
    with pytest.raises(RpcError) as caught:
        page_round_up(size)
    assert caught.value.code is ErrorCode.DMA_SIZE_OVERFLOW
    assert str(size) in str(caught.value)


@given(page=st.sampled_from([4096, 16384, 65536]), size=st.integers(0, 2**40))
def test_page_rounding_holds_for_other_page_sizes(page: int, size: int) -> None:
    rounded = page_round_up(size, page)
    assert rounded % page == 0
    assert 0 <= rounded - size < page


@pytest.mark.parametrize(
    ("size", "code"),
    [
        (0, ErrorCode.DMA_BUF_ALLOC),
        (-1, ErrorCode.INVALID_ARGUMENT),
        (MAX_BUFFER_SIZE + 1, ErrorCode.DMA_EXCEEDS_MAX_SIZE),
        (2**64 - 1, ErrorCode.DMA_EXCEEDS_MAX_SIZE),
        (2**64 + 5, ErrorCode.DMA_EXCEEDS_MAX_SIZE),
        (True, ErrorCode.INVALID_ARGUMENT),
        (1.5, ErrorCode.INVALID_ARGUMENT),
    ],
)
def test_bad_sizes_get_their_specific_error(size: object, code: ErrorCode) -> None:
    with pytest.raises(RpcError) as caught:
        checked_dma_size(size)  # type: ignore[arg-type]
    assert caught.value.code is code


def test_exceeds_max_names_the_ceiling_it_passed() -> None:
    """Error 202's text names the ceiling that applies (it said "256 MB" before version
    6 raised a buffer's to 4 GiB): the published prefix stays, operators grep it."""
    with pytest.raises(RpcError) as caught:
        checked_dma_size(MAX_BUFFER_SIZE + 1)
    assert str(caught.value) == (
        f"DMA buffer size {MAX_BUFFER_SIZE + 1} exceeds the maximum of {MAX_BUFFER_SIZE} bytes"
    )
    assert caught.value.fields == {"size": MAX_BUFFER_SIZE + 1, "limit": MAX_BUFFER_SIZE}


def test_good_sizes_round_to_pages() -> None:
    assert checked_dma_size(1) == PAGE_SIZE
    assert checked_dma_size(PAGE_SIZE) == PAGE_SIZE
    assert checked_dma_size(MAX_DMA_SIZE) == MAX_DMA_SIZE
    # Version 6: past the old 256 MiB, with llama.cpp's guard page, up to the wire's 4 GiB.
    assert checked_dma_size(MAX_DMA_SIZE + 4096) == MAX_DMA_SIZE + 4096
    assert checked_dma_size(MAX_BUFFER_SIZE) == MAX_BUFFER_SIZE
