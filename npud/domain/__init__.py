"""Domains: one DSP process (one FastRPC session) each, and what they share.

* :mod:`npud.domain.device`: the one DSP and what every domain shares (driver,
  verified shell, memory, the closer lane);
* :mod:`npud.domain.life`: one domain's session, lanes, epoch and recovery;
* :mod:`npud.domain.registry`: what a domain holds on the DSP, with leases;
* :mod:`npud.domain.memory` and :mod:`npud.domain.pool`: the buffers handed to
  clients, from the system DMA-BUF heap, and the pool that keeps freed ones;
* :mod:`npud.domain.placement` and :mod:`npud.domain.domains`: which connection
  runs in which domain, and the set of domains.

Nothing here knows the daemon's clients or requests: domains sit below them.
"""
