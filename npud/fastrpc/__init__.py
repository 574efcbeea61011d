"""The FastRPC core, synchronous (no trio), by concern: ``kernel`` (the uapi ABI, the
Driver seam, DMA-BUFs, INVOKE arguments), ``session`` (FastRpcSession), ``reverse``
(the reverse-RPC listener and its services), ``trust`` (shell verification),
``recording`` (trace and replay), ``stubs`` (portal_qnn, the model file) and ``host``
(the CPU side of dspqueue and ggml-hexagon). The folders stand in floors, from the
ground up: kernel; reverse and trust; session; stubs and recording; host. Each imports
only folders on floors below its own (tests/unit/test_layering.py)."""
