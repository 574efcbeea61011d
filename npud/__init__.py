"""npud: the daemon that brokers the Hexagon NPU (CDSP) over FastRPC."""

__version__ = "0.1.0"
