"""The hot path: worker threads over one epoll, and each welcomed connection's link."""
