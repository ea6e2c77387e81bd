"""The doit DAG: the task loader, the instance tasks and their action, status, the reporter."""
