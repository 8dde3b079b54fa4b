"""`leveret serve --workers N`: wire worker processes beside the main process (docs/WORKERS.md)."""
