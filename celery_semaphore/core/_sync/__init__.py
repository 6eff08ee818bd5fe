"""The synchronous semaphore, generated from ``core/_async`` by ``scripts/unasync.py``."""
