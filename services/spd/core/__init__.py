"""The SPD algorithm core: pure, process-agnostic, driven in-process by tests and by the services."""
