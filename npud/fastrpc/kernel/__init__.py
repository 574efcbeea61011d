"""The kernel side: the uapi ABI mirror, the Driver seam, errno translation, DMA-BUFs and
the heap, INVOKE arguments and their marshalling, the DSP's capabilities.
"""
