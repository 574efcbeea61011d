"""portal_qnn's limits as the host sees them (idl/portal_qnn.idl and the skel's
buffers): what npud.fastrpc.stubs.portal_qnn and its parts check against."""

from __future__ import annotations

from typing import Final

MAX_MODELS: Final = 4
MAX_TENSORS: Final = 32
MAX_RANK: Final = 8
MAX_URI_BYTES: Final = 512  # model_uri with its NUL
MAX_ERROR_BYTES: Final = 256  # last_error's capacity: the skel keeps at most 255 bytes of text
NO_MODEL: Final = 0xFFFFFFFF  # last_error's model_index for the handle's last model_load
OUTPUT_DIMS_STRIDE: Final = 1 + MAX_RANK  # output_dims: each output's rank, then 8 dims
MAX_GRAPH_NAME_BYTES: Final = 128  # graph_name's capacity: names are at most 127 bytes
MAX_GRAPHS: Final = 8  # graphs per model (idl/portal_qnn.idl)
