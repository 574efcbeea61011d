"""Recording a FastRPC run (the tracing driver, the trace format) and replaying it against
FastRpcSession.
"""
