"""Reverse RPC: the listener that serves the DSP's calls into this host, and the services
it serves (apps_mem, apps_std, the remotectl modules, the files lent for a load).
"""
