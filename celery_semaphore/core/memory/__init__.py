"""The memory store: the reference model (`celery_semaphore.core.model`) as a store.

``Semaphore("memory://", "name", 3)`` keeps its state in this process, in the model
that states the rules, so code that uses semaphores (and the Celery side's own tests)
can run without a server where timing does not matter: every semaphore made with the
same ``memory://<name>`` URL in one process shares one state; another name is another
store. Nothing is persisted and nothing crosses processes.

- ``backend.py``: the shared state (one model per semaphore, one lock) and the model's
  replies as results;
- ``_async/store.py``: `AsyncMemoryStore`, the source; ``_sync/store.py``:
  `MemoryStore`, generated from it (``scripts/unasync.py``).
"""
