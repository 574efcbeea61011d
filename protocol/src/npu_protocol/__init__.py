"""npud's wire protocol: messages, framing and stable error codes. Pure: no I/O."""

from npu_protocol.aee import AEE, DSP_AEE_EOFFSET, aee_name, describe_result
from npu_protocol.errors import MAX_DMA_SIZE, ErrorCode, format_message

__all__ = [
    "AEE",
    "DSP_AEE_EOFFSET",
    "MAX_DMA_SIZE",
    "ErrorCode",
    "aee_name",
    "describe_result",
    "format_message",
]
