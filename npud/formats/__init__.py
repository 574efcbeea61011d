"""File formats npud reads on behalf of clients, parsed without resolving anything.

Pure code, standard library only: both the daemon (which checks a client's
file before the DSP sees it) and the emulated DSP (which checks it again
before its model runtime does) import it, and neither may import the other.
"""
