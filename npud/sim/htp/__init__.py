"""The emulated DSP side of llama.cpp's Hexagon backend (ggml-hexagon's ``htp``).

* :mod:`~npud.sim.htp.skel`: the ``htp_iface`` skel (``libggml-htp-v73.so``) and the
  batch worker it starts on the session's dspqueue;
* :mod:`~npud.sim.htp.layout`: the wire (op batches, tensors, op codes, statuses);
* :mod:`~npud.sim.htp.tensors`, :mod:`~npud.sim.htp.quant`: tensors as numpy views of
  the mapped buffers, ggml's block formats and the host's repacked tiles;
* :mod:`~npud.sim.htp.ops` and the ``ops_*`` modules: the ops, as ggml-cpu computes
  them, in float32.
"""
