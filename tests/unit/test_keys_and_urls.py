"""Key names and hash tags; URL forms and password masking (no Redis)."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from celery_semaphore.core.redis.connection import connect, mask_url
from celery_semaphore.core.redis.keys import ROLES, name_from_meta_key, semaphore_keys


@pytest.mark.parametrize("name", ["plain", "a}b", "{x}", "100%", "%7D", "a:b"])
def test_every_key_shares_one_hash_tag_and_the_name_comes_back(name: str) -> None:
    keys = semaphore_keys("ns", name)
    tags = {k[k.index("{") + 1 : k.index("}")] for k in keys[:-1]}
    assert len(tags) == 1
    assert "{" not in tags.pop()
    assert [k.rsplit(":", 1)[1] for k in keys.script_keys] == list(ROLES)
    assert name_from_meta_key("ns", keys.meta) == name
    assert name_from_meta_key("ns", keys.parked, role="parked") == name
    assert name_from_meta_key("other", keys.meta) is None


@pytest.mark.parametrize("name", ["plain", "a}b", "customer-17", "x" * 200])
def test_the_epoch_hash_is_one_per_redis_or_on_the_semaphores_own_cluster_slot(
    name: str,
) -> None:
    assert semaphore_keys("ns", name).epoch == "ns:epoch"
    keys = semaphore_keys("ns", name, cluster=True)
    assert key_slot(keys.epoch.encode()) == key_slot(keys.holders.encode())
    assert keys.epoch.startswith("ns:epoch:{")


def test_names_that_differ_only_in_escaped_characters_do_not_collide() -> None:
    assert semaphore_keys("ns", "a}b").meta != semaphore_keys("ns", "a%7Db").meta


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://:secret@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://user:secret@h/0", "redis://user:***@h/0"),
        ("rediss://u:p@ss@w0rd@h:1/0", "rediss://u:***@h:1/0"),
        ("redis://h/0?password=secret&db=1", "redis://h/0?password=***&db=1"),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_passwords_never_show(url: str, masked: str) -> None:
    assert mask_url(url) == masked


@pytest.mark.parametrize("url", ["http://h:1/0", "redis+nope://h", "redis:/h", "", "memcached://x"])
def test_a_url_that_is_not_understood_is_refused_naming_the_forms(url: str) -> None:
    with pytest.raises((ValueError, TypeError), match="redis"):
        connect(url)


def test_a_client_of_the_wrong_kind_is_refused() -> None:
    with pytest.raises(TypeError, match="redis must be a URL string"):
        connect(42)
