"""The daemon's outer parts: the command line, the listening socket, each connection's
handshake, and the broker that puts the parts together."""
