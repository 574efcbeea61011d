"""The FastRPC core: kernel ABI, the Driver seam, FastRpcSession. Synchronous; no trio."""
