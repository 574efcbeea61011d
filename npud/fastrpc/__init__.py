"""The FastRPC core, synchronous (no trio), by concern: ``kernel`` (the uapi ABI, the
Driver seam, DMA-BUFs, INVOKE arguments), ``session`` (FastRpcSession), ``reverse``
(the reverse-RPC listener and its services), ``trust`` (shell verification),
``recording`` (trace and replay) and ``stubs`` (remotectl, portal_qnn, the model
file)."""
