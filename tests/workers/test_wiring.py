"""The wiring: every connection a process makes, built from its settings in one place.

The store (migrated if SQLite, else checked), Redis (``REDIS_URL`` or the embedded server), and
the summarizer with its guards; the rest of the pipeline gets its connections from here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from pipeline_harness import postgres_url
from sessionfold.core.errors import MissingExtraError, RedisUnavailableError, SchemaError
from sessionfold.core.summarizers import ExtractiveSummarizer
from sessionfold.runtime.redis_conn import redis_client
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.summarizer_guard import SummarizerGuard
from sessionfold.runtime.wiring import (
    make_summarizer,
    open_redis,
    open_store,
    redis_url_for,
    summarizer_guard,
)
from sessionfold.store import SCHEMA_REVISION


@pytest.fixture(autouse=True)
def no_inherited_services(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REDIS_URL", "SESSIONFOLD_REDIS_URL", "DATABASE_URL",
                 "SESSIONFOLD_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)


# --- the store ---------------------------------------------------------------------------------


def test_the_embedded_sqlite_store_is_migrated_when_opened(tmp_path: Path) -> None:
    with open_store(Settings(data_dir=tmp_path)) as store:
        assert store.check_schema() == SCHEMA_REVISION
        assert store.engine.url.database == str((tmp_path / "sessionfold.db").resolve())


def test_a_store_opened_to_be_checked_only_is_not_migrated(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="sessionfold migrate"):
        open_store(Settings(data_dir=tmp_path), migrate=False)


@pytest.mark.postgres
def test_a_postgresql_store_is_checked_not_migrated(request: pytest.FixtureRequest,
                                                    tmp_path: Path) -> None:
    url = postgres_url(request, migrate=False)
    settings = Settings(data_dir=tmp_path, database_url=url)
    with pytest.raises(SchemaError, match="sessionfold migrate"):
        open_store(settings)
    with open_store(settings, migrate=True) as store:
        assert store.check_schema() == SCHEMA_REVISION
    with open_store(settings) as store:  # migrated by an operator: it opens
        assert store.engine.dialect.name == "postgresql"


# --- Redis -------------------------------------------------------------------------------------


def test_with_redis_url_no_embedded_server_is_started(tmp_path: Path) -> None:
    endpoint = open_redis(Settings(redis_url="redis://example:6379/3", data_dir=tmp_path))
    assert (endpoint.url, endpoint.embedded, endpoint.owned) == ("redis://example:6379/3",
                                                                 False, False)
    endpoint.close()
    assert not (tmp_path / "redis").exists()


def test_a_command_that_needs_a_running_pipeline_starts_no_server(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    with pytest.raises(RedisUnavailableError, match="sessionfold up"):
        open_redis(settings, running_only=True)
    assert not (tmp_path / "redis" / "redis.url").exists()  # started, found unowned, stopped


def test_a_second_process_attaches_to_the_embedded_server_without_owning_it(
        tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    first = open_redis(settings)
    try:
        assert first.owned
        second = open_redis(settings, running_only=True)
        assert second.url == first.url and second.embedded and not second.owned
        second.close()  # not its server: it keeps running
        assert redis_client(first.url, retries=0).ping()
    finally:
        first.close()


def test_redis_url_for_prefers_the_configured_url(tmp_path: Path) -> None:
    settings = Settings(redis_url="redis://example:6379/3", data_dir=tmp_path)
    with redis_url_for(settings) as url:
        assert url == "redis://example:6379/3"
    assert not (tmp_path / "redis").exists()


def test_redis_url_for_runs_an_embedded_server_without_one(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("SESSIONFOLD_REDIS_URL", raising=False)
    settings = Settings(data_dir=tmp_path)
    seen: list[Callable[[], bool]] = []
    with redis_url_for(settings) as url:
        assert url.startswith("unix://")
        client = redis_client(url, retries=0)
        assert client.ping()
        seen.append(client.ping)
    with pytest.raises(redis.ConnectionError):
        seen[0]()


# --- the summarizer ----------------------------------------------------------------------------


def test_the_summarizer_is_the_offline_one_without_an_api_key(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, anthropic_api_key=None, summarizer="offline")
    assert isinstance(make_summarizer(settings), ExtractiveSummarizer)


def test_the_openai_summarizer_is_built_from_its_settings(tmp_path: Path) -> None:
    from sessionfold.runtime.providers.openai import OpenAISummarizer

    settings = Settings(data_dir=tmp_path, summarizer="openai", openai_api_key="sk-test",
                        openai_base_url="http://user:s3cret@vllm.internal:8000/v1",
                        summarizer_model="gpt-4.1-nano", summarizer_context_tokens=24_000,
                        summarizer_timeout_s=12)
    summarizer = make_summarizer(settings)
    assert isinstance(summarizer, OpenAISummarizer)
    assert (summarizer.model, summarizer.context_tokens, summarizer.timeout) == (
        "gpt-4.1-nano", 24_000, 12)
    assert "vllm.internal:8000/v1" in repr(summarizer) and "s3cret" not in repr(summarizer)
    # Celery owns retries: the client the provider calls never retries on its own.
    assert summarizer._client.max_retries == 0


def test_each_provider_keeps_its_own_context_unless_the_settings_name_one(
        tmp_path: Path) -> None:
    anthropic_one = make_summarizer(Settings(data_dir=tmp_path, summarizer="anthropic",
                                             anthropic_api_key="sk-test"))
    openai_one = make_summarizer(Settings(data_dir=tmp_path, summarizer="openai",
                                          openai_api_key="sk-test"))
    assert (anthropic_one.context_tokens, openai_one.context_tokens) == (150_000, 100_000)
    assert (anthropic_one.model, openai_one.model) == ("claude-haiku-5-5", "gpt-4.1-mini")


def test_without_the_openai_package_the_openai_summarizer_says_which_extra_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "sessionfold.runtime.providers.openai", raising=False)
    monkeypatch.setitem(sys.modules, "openai", None)  # import openai: ModuleNotFoundError
    settings = Settings(data_dir=tmp_path, summarizer="openai", openai_api_key="sk-test")
    with pytest.raises(MissingExtraError, match=r"summarizer 'openai' needs the openai extra: "
                       r"pip install 'sessionfold\[openai\]'") as caught:
        make_summarizer(settings)
    assert caught.value.extra == "openai"


def test_an_inline_guard_never_waits_for_a_slot_and_a_background_one_does(
        make_settings: Callable[..., Settings], redis_conn: redis.Redis) -> None:
    settings = make_settings(task_soft_time_limit_s=20.0, task_time_limit_s=30.0)
    inline = summarizer_guard(settings, redis_conn, ExtractiveSummarizer(), inline=True)
    background = summarizer_guard(settings, redis_conn, ExtractiveSummarizer(), inline=False)
    assert isinstance(inline, SummarizerGuard) and not inline.wait_for_slot
    assert inline.slots.wait_s == 0 and background.slots.wait_s == 5.0
    assert inline.slots.limit == background.slots.limit == settings.summarizer_max_concurrency
