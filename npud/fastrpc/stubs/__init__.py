"""Host-side stubs of DSP interfaces: remotectl, portal_qnn and its model file format and
shapes.
"""
