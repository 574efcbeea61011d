"""npud's libcdsprpc (shim/): the C library, built and driven by C programs, against npud."""
