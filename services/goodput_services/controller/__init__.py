"""Controller: holds the job state and runs the remediation policy."""
