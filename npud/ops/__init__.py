"""Operating npud: configuration, the backend choice, logs, and the doctor, trace and
shell-signing tools."""
