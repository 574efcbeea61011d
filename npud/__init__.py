"""npud: the daemon that brokers the Hexagon NPU (CDSP) over FastRPC."""

from npud._version import __version__

__all__ = ["__version__"]
