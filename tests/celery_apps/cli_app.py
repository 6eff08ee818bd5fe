"""A minimal app for invoking the real ``celery semaphore`` CLI (CS_REDIS_URL from the env)."""

import os

from celery import Celery

app = Celery("cli_app", broker="memory://")
app.conf.semaphore_redis_url = os.environ["CS_REDIS_URL"]
