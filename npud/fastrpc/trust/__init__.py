"""The DSP shell's verification before it is loaded: digest, Ed25519 signature, the
verifier child process.
"""
