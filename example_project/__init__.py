"""A runnable example: a rate-sensitive partner API called from Celery tasks, capped cluster-wide.

- :mod:`example_project.downstream`: the partner's HTTP service (answers 429 above its capacity);
- :mod:`example_project.tasks`: the Celery app (``example_project.tasks:app``);
- :mod:`example_project.demo`: starts Redis, the service and two workers, submits a few hundred
  tasks and reports what the partner saw (``python -m example_project.demo``).
"""
