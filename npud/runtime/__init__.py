"""Threads and time: the scheduler, lanes, timers, and the closer of peers' fds."""
