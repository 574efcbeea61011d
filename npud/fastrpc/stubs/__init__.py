"""Host-side stubs of DSP interfaces: portal_qnn and its model file format and shapes.

They drive a :class:`~npud.fastrpc.session.FastRpcSession`, so they stand above
``session/`` (remotectl, which the session itself runs, lives there).
"""
