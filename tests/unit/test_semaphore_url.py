"""``semaphore_url``, the neutral name of the store's URL: read as
``semaphore_redis_url`` is (which stays), first when both are set, an error naming
both when they differ, and a postgresql:// URL in either reaches the PostgreSQL store
(made without connecting: these tests refuse every socket)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from celery import Celery

from celery_semaphore import LimitedTask
from celery_semaphore.config import check_shared_redis, get_config, task_config, url_setting
from celery_semaphore.core.memory._sync.store import MemoryStore
from celery_semaphore.core.operations import operated_store
from celery_semaphore.core.postgres._sync.store import PostgresStore
from celery_semaphore.core.postgres.operations import PostgresOperatedStore
from celery_semaphore.state import state_of

MakeApp = Callable[..., Celery]
PG = "postgresql://app:s3cret@db.internal:5432/jobs"


def django_app(**settings: str) -> Celery:
    """An app whose settings live under Django's ``CELERY_`` namespace."""
    app = Celery("django", set_as_current=False)
    app.config_from_object({"CELERY_BROKER_URL": "amqp://", **settings}, namespace="CELERY")
    return app


def test_semaphore_url_names_the_store_over_the_brokers_redis(make_app: MakeApp) -> None:
    app = make_app(broker_url="redis://broker:6379/1", semaphore_url="redis://sem:6379/2")
    assert get_config(app).redis_url == "redis://sem:6379/2"
    assert url_setting(app) == "semaphore_url"


def test_semaphore_redis_url_still_names_the_store(make_app: MakeApp) -> None:
    app = make_app(semaphore_redis_url="redis://sem:6379/2")
    assert get_config(app).redis_url == "redis://sem:6379/2"
    assert url_setting(app) == "semaphore_redis_url"


def test_both_set_to_the_same_url_is_that_url(make_app: MakeApp) -> None:
    app = make_app(semaphore_url="redis://sem/2", semaphore_redis_url="redis://sem/2")
    assert get_config(app).redis_url == "redis://sem/2"
    assert url_setting(app) == "semaphore_url"


def test_both_set_to_different_urls_is_an_error_naming_both_without_passwords(
    make_app: MakeApp,
) -> None:
    app = make_app(semaphore_url=PG, semaphore_redis_url="redis://:hunter2@sem/2")
    with pytest.raises(ValueError) as info:
        get_config(app)
    assert str(info.value) == (
        "Celery settings semaphore_url ('postgresql://app:***@db.internal:5432/jobs') and "
        "semaphore_redis_url ('redis://:***@sem/2') name different stores: set only "
        "semaphore_url (semaphore_redis_url is its older name)"
    )
    with pytest.raises(ValueError, match="name different stores"):
        check_shared_redis(app)  # a worker's first check says the same


def test_under_a_django_namespace_the_settings_are_named_as_spelt() -> None:
    assert get_config(django_app(CELERY_SEMAPHORE_URL=PG)).redis_url == PG
    assert url_setting(django_app(CELERY_SEMAPHORE_URL=PG)) == "CELERY_SEMAPHORE_URL"
    both = django_app(CELERY_SEMAPHORE_URL=PG, CELERY_SEMAPHORE_REDIS_URL="redis://r/0")
    with pytest.raises(ValueError, match=r"^Celery settings CELERY_SEMAPHORE_URL \("):
        get_config(both)
    with pytest.raises(ValueError, match=r"set only CELERY_SEMAPHORE_URL \(CELERY_SEMAPHORE_RED"):
        get_config(both)


def test_semaphore_url_is_a_known_setting_and_a_near_miss_is_pointed_to_it(
    make_app: MakeApp,
) -> None:
    get_config(make_app(semaphore_url="redis://r/0"))  # no "unknown Celery setting"
    with pytest.raises(ValueError, match=r"^unknown Celery setting semaphore_ulr; did you mean "):
        get_config(make_app(semaphore_ulr="redis://r/0"))
    with pytest.raises(ValueError, match="did you mean CELERY_SEMAPHORE_URL"):
        get_config(django_app(CELERY_SEMAPHORE_ULR=PG))


def test_semaphore_url_is_app_wide_not_a_task_option(make_app: MakeApp) -> None:
    app = make_app(semaphore_url="redis://r/0")
    app.finalize()
    with pytest.raises(ValueError, match=r"limited: unknown option semaphore_url; accepted: "):

        @app.task(base=LimitedTask, semaphore="s", limit=1, semaphore_url="r://", shared=False)
        def limited() -> None: ...


def test_semaphore_url_is_a_store_the_semaphores_can_share(make_app: MakeApp) -> None:
    """The rule that a non-Redis broker needs a store URL is met by either setting, and
    the refusal suggests the neutral one too."""
    check_shared_redis(make_app(semaphore_url=PG))
    check_shared_redis(make_app(semaphore_redis_url=PG))
    with pytest.raises(ValueError) as info:
        check_shared_redis(make_app())
    message = str(info.value)
    assert message.startswith("Celery setting semaphore_redis_url is not set and the broker")
    assert "Set semaphore_url (or semaphore_redis_url) to the store every worker" in message


@pytest.mark.parametrize("setting", ["semaphore_url", "semaphore_redis_url"])
def test_a_postgresql_url_in_either_setting_reaches_the_postgresql_store(
    make_app: MakeApp, setting: str
) -> None:
    app = make_app(**{setting: PG})
    app.finalize()

    @app.task(base=LimitedTask, semaphore="s", limit=1, shared=False)
    def limited() -> None: ...

    config = task_config(limited)
    store = state_of(app).semaphores.store(config.redis_url)
    assert isinstance(store, PostgresOperatedStore)
    assert (store.target, store.url) == (PG, "postgresql://app:***@db.internal:5432/jobs")
    quick = state_of(app).semaphores.store(config.redis_url, quick=True)
    assert isinstance(quick, PostgresOperatedStore)


def test_operated_store_takes_a_postgresql_url_or_an_operated_store() -> None:
    store = operated_store(PG)
    assert isinstance(store, PostgresOperatedStore)
    assert operated_store(store) is store
    assert isinstance(operated_store("memory://url-test"), MemoryStore)
    with pytest.raises(TypeError, match=r"has no operators' side: pass its URL"):
        operated_store(PostgresStore(PG))
