"""Settings: every ``semaphore_*`` Celery setting, read once per app into a typed object.

- ``semaphore_url``: where the semaphores live: a Redis URL (``redis://``,
  ``rediss://``, ``unix://``), ``postgresql://...`` (`celery_semaphore.core.postgres`)
  or ``memory://`` (one process, for tests). Default: the broker URL if it is Redis;
  with any other broker it must be set (workers refuse to start, and limited tasks
  to be published or run, without it: `check_shared_redis()`).
- ``semaphore_redis_url``: its older name, read the same way; if both are set they
  must be the same URL (`store_url()`).
- ``semaphore_namespace`` (``"celery_semaphore"``): key prefix in Redis (a column
  of the semaphores' table on PostgreSQL).
- ``semaphore_lease_timeout`` (60 s): lease of a permit; the worker renews it.
- ``semaphore_heartbeat_interval`` (lease / 4): how often the worker renews.
- ``semaphore_backoff_base`` (0.5 s) and ``semaphore_backoff_max`` (60 s):
  exponential backoff between waits when the turn can't be estimated, and the
  cap of every countdown; with ``max_block`` it must stay below half the Redis
  broker's ``visibility_timeout`` (checked), or waiting tasks would run twice.
- ``semaphore_backoff_jitter`` (True): full jitter on that backoff.
- ``semaphore_wait_mode`` (``"handover"``): how a task refused a permit waits.
  ``"handover"``: it parks (its message is kept beside its place in line, in
  Redis) and is published again when its turn comes; ``"countdown"``: it is
  retried with a countdown aimed at its estimated turn.
- ``semaphore_max_block`` (1.0 s): a task among the next ``limit`` in line
  whose turn is due within this long waits for it in place (blocking its
  worker process at most this long) instead of parking or retrying; 0 never
  waits in place. For a task that would otherwise park, at most 0.1 s while
  every other process (thread, greenlet) of its worker's pool runs a task
  (`celery_semaphore.worker.pool_occupancy`). In handover mode
  it also sets the window: parked tasks whose turn is due within ``max_block``,
  at most 0.1 s, are handed over ahead of time, so they wait in place.
- ``semaphore_handover_deadline`` (30 s): a handed-over task that has not
  reached a worker by then is published again (its late copy is dropped).
- ``semaphore_park_max_bytes`` (262144): a task whose message is larger is not
  parked but retried with a countdown.
- ``semaphore_park_without_persistence``: retired, ignored (`RETIRED`): accepted so
  that a deployment that sets it still starts, with one WARNING per process. Where
  waiting tasks park now: `celery_semaphore.durability`.
- ``semaphore_max_waits`` / ``semaphore_max_wait_time`` (None: unlimited): the
  wait budget, in waits or seconds since the first ask; then the task fails
  with `SemaphoreTimeout`.
- ``semaphore_on_redis_error`` (``"retry"``): when Redis can't be reached,
  ``"retry"`` later (never run without a permit; a Redis that has not answered the
  worker since it started fails the task instead), ``"fail"`` the task, or ``"run"``
  it without a permit.
- ``semaphore_queue_limits`` (``{}``): ``{queue name: limit}`` caps per queue.
- ``semaphore_queue_rates`` (``{}``): ``{queue name: rate}`` start rates per queue,
  in Celery's rate syntax (``{"emails": "50/s"}``); with a cap on the same queue,
  both are granted in one step.
- ``semaphore_send_events`` (None: as the worker's ``-E``): send the Celery
  events ``semaphore-waiting``, ``semaphore-granted`` and ``semaphore-lost``.
- ``semaphore_metrics_per_key`` (False): the metrics show each semaphore of a
  key function's family as its own series, instead of one series per family.
- ``semaphore_keep_idle`` (0: off): a pool process keeps its permit between tasks
  while nobody waits, and gives it back after this many idle seconds, at once when a
  line forms, and when it stops (`celery_semaphore.kept_permits`).

A `LimitedTask` takes the same names as decorator
options to override them per task (all but the app-wide store URL, namespace,
queue limits and rates, events and per-key metrics), next to its own limits
(``semaphore``, ``limit``, ``rate`` or ``limits``: `celery_semaphore.limits`).
"""

from __future__ import annotations

import difflib
import logging
import threading
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .core import validation
from .core.rates import RateLimit, parse_rate
from .core.urls import mask_url

logger = logging.getLogger(__name__)

REDIS_ERROR_POLICIES = ("retry", "fail", "run")
WAIT_MODES = ("handover", "countdown")
PREFIX = "semaphore_"
APP_WIDE = frozenset(
    {"redis_url", "namespace", "queue_limits", "queue_rates", "send_events", "metrics_per_key"}
)
#: The settings that name the store, without the prefix: the neutral name, then the
#: older one (read into `SemaphoreConfig.redis_url`).
URL_SETTINGS = ("url", "redis_url")
DEFAULT_REDIS_URL = "redis://localhost:6379/0"
#: A few hand-overs through the broker: how far ahead of its turn a parked task is
#: handed over, and the longest wait in place in a worker whose other pool
#: processes all run tasks (`celery_semaphore.worker.pool_occupancy`).
NEAR_TURN = 0.1
#: Settings that no longer do anything, each with what to know instead: still
#: accepted (app-wide or as a task's option, any value), never read, and named in
#: one WARNING per process (`without_retired()`).
RETIRED = {
    "park_without_persistence": (
        "on RabbitMQ and Redis brokers waiting tasks park in the broker's own server; on "
        "other brokers they park only in a Redis that keeps every write (appendonly yes), "
        "else they wait as countdown retries"
    ),
}
_retired_lock = threading.Lock()
_retired_warned: set[str] = set()


@dataclass(frozen=True)
class SemaphoreConfig:
    """The ``semaphore_*`` settings of an app (or of one task: the app's with the
    task's options), validated: each field is a setting without its prefix."""

    #: The store's URL: ``semaphore_url`` or ``semaphore_redis_url`` (`store_url()`).
    redis_url: str = "redis://localhost:6379/0"
    namespace: str = "celery_semaphore"
    lease_timeout: float = 60.0
    heartbeat_interval: float | None = None
    backoff_base: float = 0.5
    backoff_max: float = 60.0
    backoff_jitter: bool = True
    wait_mode: str = "handover"
    max_block: float = 1.0
    handover_deadline: float = 30.0
    park_max_bytes: int = 262144
    park_without_persistence: object = None  # retired (`RETIRED`): never read
    max_waits: int | None = None
    max_wait_time: float | None = None
    on_redis_error: str = "retry"
    queue_limits: dict[str, int] = field(default_factory=dict)
    queue_rates: dict[str, RateLimit] = field(default_factory=dict)
    send_events: bool | None = None
    metrics_per_key: bool = False
    keep_idle: float = 0.0

    def __post_init__(self) -> None:
        validation.check_namespace(self.namespace)
        validation.check_seconds(self.lease_timeout, "lease_timeout")
        if self.heartbeat_interval is not None:
            validation.check_seconds(self.heartbeat_interval, "heartbeat_interval")
            if self.heartbeat_interval >= self.lease_timeout:
                raise ValueError(
                    f"heartbeat_interval ({self.heartbeat_interval}s) must be shorter than "
                    f"lease_timeout ({self.lease_timeout}s), or leases run out between renewals"
                )
        validation.check_seconds(self.backoff_base, "backoff_base")
        validation.check_seconds(self.backoff_max, "backoff_max")
        validation.check_seconds(self.max_block, "max_block", allow_zero=True)
        if self.wait_mode not in WAIT_MODES:
            raise ValueError(
                f"wait_mode must be one of {', '.join(WAIT_MODES)}, got {self.wait_mode!r}"
            )
        validation.check_seconds(self.handover_deadline, "handover_deadline")
        validation.check_seconds(self.keep_idle, "keep_idle", allow_zero=True)
        validation.check_limit(self.park_max_bytes, "park_max_bytes")
        if self.send_events is not None and not isinstance(self.send_events, bool):
            raise TypeError(f"send_events must be True, False or None, got {self.send_events!r}")
        if not isinstance(self.metrics_per_key, bool):
            raise TypeError(f"metrics_per_key must be True or False, got {self.metrics_per_key!r}")
        if not isinstance(self.backoff_jitter, bool):
            raise TypeError(f"backoff_jitter must be True or False, got {self.backoff_jitter!r}")
        if self.max_waits is not None:
            validation.check_limit(self.max_waits, "max_waits")
        if self.max_wait_time is not None:
            validation.check_seconds(self.max_wait_time, "max_wait_time")
        if self.on_redis_error not in REDIS_ERROR_POLICIES:
            raise ValueError(
                f"on_redis_error must be one of {', '.join(REDIS_ERROR_POLICIES)}, "
                f"got {self.on_redis_error!r}"
            )
        if not isinstance(self.queue_limits, dict):
            raise TypeError(
                f"queue_limits must be a dict of queue name -> limit, got {self.queue_limits!r}"
            )
        for queue, limit in self.queue_limits.items():
            validation.check_name(queue, "queue_limits key")
            validation.check_limit(limit, f"queue_limits[{queue!r}]")
        if not isinstance(self.queue_rates, dict):
            raise TypeError(
                f"queue_rates must be a dict of queue name -> rate like '50/s', "
                f"got {self.queue_rates!r}"
            )
        for queue in self.queue_rates:
            validation.check_name(queue, "queue_rates key")
        rates = {q: parse_rate(r, f"queue_rates[{q!r}]") for q, r in self.queue_rates.items()}
        object.__setattr__(self, "queue_rates", rates)  # read once: texts become RateLimits

    @property
    def parks(self) -> bool:
        """Whether a task with these settings waits parked (handover mode): the one
        reading of ``wait_mode``. Give it the task's own settings (`task_config()`)."""
        return self.wait_mode == "handover"

    @property
    def handover_window(self) -> float:
        """How far ahead of its turn a parked task is handed over (under a rate: of its
        slot, at most this): ``max_block``, at most `NEAR_TURN`. Sooner, it could reach
        a worker that keeps it waiting in place only that long (busy:
        `celery_semaphore.worker.pool_occupancy`), and park again."""
        return min(self.max_block, NEAR_TURN)

    @property
    def renew_every(self) -> float:
        return self.heartbeat_interval or self.lease_timeout / 4

    def with_options(self, options: dict[str, Any], owner: str) -> SemaphoreConfig:
        """This config with per-task overrides, errors naming ``owner`` (the task)."""
        known = {f.name for f in fields(self)} - APP_WIDE
        unknown = set(options) - known
        if unknown:
            raise ValueError(
                f"{owner}: unknown semaphore option(s) {', '.join(sorted(unknown))}; "
                f"accepted: semaphore, limit, {', '.join(sorted(known))}"
            )
        try:
            return replace(self, **without_retired(options))
        except (TypeError, ValueError) as error:
            raise type(error)(f"{owner}: {error}") from None


def without_retired(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` (an app's, or a task's options) without the `RETIRED` ones: the
    first time a process meets one, set to anything, it logs a WARNING naming it (a
    worker reads its app's and tasks' settings before its pool forks, so its children
    do not say it again)."""
    retired = sorted(set(settings) & RETIRED.keys())
    if not retired:
        return settings
    with _retired_lock:
        new = [name for name in retired if name not in _retired_warned]
        _retired_warned.update(new)
    for name in new:
        logger.warning(
            "celery-semaphore: the setting %s%s is retired and ignored: %s. Remove it "
            "(from the Celery settings and from every task's options)",
            PREFIX,
            name,
            RETIRED[name],
        )
    return {name: value for name, value in settings.items() if name not in RETIRED}


def spelled(app: Any, setting: str) -> str:
    """Setting ``semaphore_<setting>`` as ``app`` spells its settings: under a settings
    namespace (Django's ``config_from_object(..., namespace="CELERY")``),
    ``CELERY_SEMAPHORE_<SETTING>``."""
    name = PREFIX + setting
    namespace = getattr(app, "namespace", None)
    if isinstance(namespace, str) and namespace:
        return f"{namespace}_{name.upper()}"
    return name


def store_url(app: Any) -> Any:
    """The store URL ``app`` sets: ``semaphore_url``, else ``semaphore_redis_url``
    (None: neither). ValueError if both are set to different URLs, naming both (the
    passwords masked): either could be the one meant."""
    url, redis_url = (app.conf.get(PREFIX + setting) for setting in URL_SETTINGS)
    if url is not None and redis_url is not None and url != redis_url:
        neutral, older = (spelled(app, setting) for setting in URL_SETTINGS)
        raise ValueError(
            f"Celery settings {neutral} ({_shown(url)}) and {older} ({_shown(redis_url)}) "
            f"name different stores: set only {neutral} ({older} is its older name)"
        )
    return url if url is not None else redis_url


def url_setting(app: Any) -> str:
    """The name of the setting ``app``'s store URL comes from, as the app spells it:
    ``semaphore_url`` if set, else ``semaphore_redis_url`` (set, or not: the default)."""
    return spelled(app, "url" if app.conf.get(PREFIX + "url") is not None else "redis_url")


def _shown(url: Any) -> str:
    return repr(mask_url(url)) if isinstance(url, str) else repr(url)


def check_shared_redis(app: Any) -> None:
    """The rule, for workers (at start) and publishers (at a limited task's first
    publish, through `task_config()`): a broker that is not a Redis URL and no
    ``semaphore_url`` (nor ``semaphore_redis_url``) would make each machine count on
    its own ``redis://localhost:6379/0`` (whatever Redis happens to listen there): a
    per-machine cap that looks cluster-wide. ValueError: say so, and what to set."""
    if store_url(app) is not None or _is_redis_url(app.conf.broker_url):
        return
    broker = app.conf.broker_url or ""
    scheme = broker.split("://", 1)[0] + "://" if "://" in str(broker) else repr(broker)
    setting, neutral = spelled(app, "redis_url"), spelled(app, "url")
    raise ValueError(
        f"Celery setting {setting} is not set and the broker ({scheme}) is not a "
        f"Redis URL the semaphores can share: each worker and publisher would use "
        f"{DEFAULT_REDIS_URL} on its own machine, a per-machine cap. Set {neutral} (or "
        f"{setting}) to the store every worker and publisher reaches (for example "
        "redis://redis.internal:6379/0 or postgresql://user:password@db.internal/app)"
    )


def _is_redis_url(broker: Any) -> bool:
    return isinstance(broker, str) and broker.startswith(("redis://", "rediss://", "unix://"))


def default_redis_url(app: Any) -> str:
    """The store URL when neither ``semaphore_url`` nor ``semaphore_redis_url`` is set:
    the broker's URL if it is Redis (the first of a ``;``-separated list), else
    `DEFAULT_REDIS_URL`, which only a process that touches no limited task may use
    (`check_shared_redis()`)."""
    broker = app.conf.broker_url
    return broker.split(";")[0] if _is_redis_url(broker) else DEFAULT_REDIS_URL


REDIS_BROKERS = ("redis://", "rediss://", "unix://", "redis+socket://", "sentinel://")
DEFAULT_VISIBILITY_TIMEOUT = 3600.0


def visibility_timeout(app: Any) -> float | None:
    """The Redis broker's ``visibility_timeout`` (None for other brokers): a message
    left unacked longer than this is delivered again."""
    broker = app.conf.broker_url or ""
    if not isinstance(broker, str) or not broker.startswith(REDIS_BROKERS):
        return None
    options = app.conf.broker_transport_options or {}
    return float(options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT))


def check_backoff(app: Any, config: SemaphoreConfig, owner: str) -> None:
    """A waiting task's retry is an ETA message its worker holds unacked until the
    countdown ends: on Redis that must stay far below ``visibility_timeout``."""
    timeout = visibility_timeout(app)
    longest = config.backoff_max + config.max_block
    if timeout is not None and longest >= timeout / 2:
        raise ValueError(
            f"{owner}backoff_max ({config.backoff_max:g}s) plus {PREFIX}max_block "
            f"({config.max_block:g}s) must stay below half the Redis broker's "
            f"visibility_timeout ({timeout:g}s, broker_transport_options): a waiting task's "
            "message stays unacked until its countdown ends, and Redis delivers it again "
            "after visibility_timeout, so the task would run twice"
        )


def _check_names(app: Any) -> None:
    """A misspelt setting would otherwise be ignored without a word: ``semaphore_*``
    keys, and under a settings namespace (Django's ``config_from_object(...,
    namespace="CELERY")``) ``CELERY_SEMAPHORE_*`` ones too."""
    names = [PREFIX + "url", *(PREFIX + f.name for f in fields(SemaphoreConfig))]
    spellings = [(PREFIX, names)]
    namespace = getattr(app, "namespace", None)
    if isinstance(namespace, str) and namespace:
        upper = f"{namespace}_{PREFIX.upper()}"
        spellings.append((upper, [f"{namespace}_{n.upper()}" for n in names]))
    for key in app.conf:
        for prefix, known in spellings:
            if isinstance(key, str) and key.startswith(prefix) and key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"did you mean {close[0]}? " if close else ""
                raise ValueError(f"unknown Celery setting {key}; {hint}known: {', '.join(known)}")


@dataclass
class _Cached:
    """The settings read for one app: its own, and each task's with its options."""

    app: SemaphoreConfig | None = None
    tasks: dict[str, SemaphoreConfig] = field(default_factory=dict)


#: Where an app keeps its cached settings (in ``app.__dict__``, beside the plugin's
#: runtime state, which `celery_semaphore.state.reset` forgets with them).
CACHE_ATTRIBUTE = "semaphore_settings"


def _cached(app: Any) -> _Cached:
    cached: _Cached | None = app.__dict__.get(CACHE_ATTRIBUTE)
    if cached is None:
        cached = app.__dict__.setdefault(CACHE_ATTRIBUTE, _Cached())
    return cached


def forget_config(app: Any) -> None:
    """Drop ``app``'s cached settings: the next use reads ``app.conf`` again."""
    app.__dict__.pop(CACHE_ATTRIBUTE, None)


def get_config(app: Any) -> SemaphoreConfig:
    """The app's settings, validated once and cached (errors name the setting)."""
    cached = _cached(app)
    config = cached.app
    if config is None:
        _check_names(app)
        values: dict[str, Any] = {}
        for f in fields(SemaphoreConfig):
            value = app.conf.get(PREFIX + f.name)
            if value is not None:
                values[f.name] = value
        url = store_url(app)
        values["redis_url"] = default_redis_url(app) if url is None else url
        try:
            config = SemaphoreConfig(**without_retired(values))
        except (TypeError, ValueError) as error:
            raise type(error)(f"Celery setting {PREFIX}{error}") from None
        check_backoff(app, config, f"Celery setting {PREFIX}")
        cached.app = config
    return config


def uses_handover(app: Any) -> bool:
    """Whether any task of ``app`` waits in handover mode: the app's
    ``semaphore_wait_mode``, or a task's own. Its workers then consume the
    handover queues and look after parked tasks, whatever the app's setting."""
    if get_config(app).parks:
        return True
    return any(
        task_config(task).parks
        for task in list(app.tasks.values())
        if getattr(type(task), "semaphore_options", None)
    )


def task_config(task: Any) -> SemaphoreConfig:
    """The app's settings with the task's ``semaphore_*`` options applied (cached per
    task). Every use of a limited task reads them (its publish, its admission, an eager
    run), so an app whose semaphores have no Redis to share refuses them all here
    (`check_shared_redis()`), at the first."""
    configs = _cached(task.app).tasks
    config = configs.get(task.name)
    if config is None:
        app_config = get_config(task.app)
        check_shared_redis(task.app)
        options = getattr(type(task), "semaphore_options", None) or {}
        config = app_config.with_options(options, f"task {task.name}")
        check_backoff(task.app, config, f"task {task.name}: {PREFIX}")
        configs[task.name] = config
    return config
