"""Settings: read from the environment, validated with clear messages, secrets never shown."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from sessionfold.core.errors import InvalidInputError
from sessionfold.runtime.settings import Settings, env_name, redact_url


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No setting leaks in from the machine's environment."""
    for name in list(os.environ):
        if name.startswith("SESSIONFOLD_") or name in (
                "DATABASE_URL", "REDIS_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
                "OPENAI_API_KEY", "OPENAI_BASE_URL"):
            monkeypatch.delenv(name)


def test_standard_names_are_plain_and_the_rest_prefixed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://app@db/sessions")
    monkeypatch.setenv("REDIS_URL", "redis://cache:6379/2")
    monkeypatch.setenv("SESSIONFOLD_WORKER_CONCURRENCY", "7")
    monkeypatch.setenv("SESSIONFOLD_KEY_PREFIX", "prod:")
    monkeypatch.setenv("SESSIONFOLD_SESSION_SPEND_CAP_USD", "2.5")
    monkeypatch.setenv("WORKER_CONCURRENCY", "99")  # unprefixed: not ours
    settings = Settings()
    assert settings.database_url == "postgresql+psycopg://app@db/sessions"
    assert settings.redis_url == "redis://cache:6379/2"
    assert settings.worker_concurrency == 7
    assert settings.key_prefix == "prod:"
    assert settings.session_spend_cap_usd == 2.5


def test_absent_urls_mean_the_embedded_defaults() -> None:
    settings = Settings()
    assert settings.redis_url is None
    assert settings.database_url is None


def test_summarizer_defaults_to_anthropic_only_with_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().summarizer == "offline"
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    settings = Settings()
    assert settings.summarizer == "anthropic"
    assert settings.summarizer_kind == "anthropic"
    assert settings.anthropic_api_key is not None
    assert settings.anthropic_api_key.get_secret_value() == "sk-ant-test"
    assert Settings(summarizer="offline").summarizer == "offline"
    assert settings.summarizer_model == "claude-haiku-5-5"


def test_anthropic_summarizer_without_a_key_says_what_to_set() -> None:
    with pytest.raises(InvalidInputError, match="ANTHROPIC_API_KEY") as info:
        Settings(summarizer="anthropic")
    assert "SESSIONFOLD_SUMMARIZER=offline" in str(info.value)


def test_the_openai_summarizer_is_chosen_by_name_with_the_sdks_own_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-test")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:11434/v1")
    assert Settings().summarizer_kind == "offline"  # an OpenAI key alone chooses nothing
    monkeypatch.setenv("SESSIONFOLD_SUMMARIZER", "openai")
    settings = Settings()
    assert settings.summarizer_kind == "openai"
    assert settings.openai_base_url == "http://localhost:11434/v1"
    assert settings.openai_api_key is not None
    assert settings.openai_api_key.get_secret_value() == "sk-openai-test"
    # Its own default model, not the Anthropic one; a named model wins.
    assert settings.summarizer_model == "gpt-4.1-mini"
    monkeypatch.setenv("SESSIONFOLD_SUMMARIZER_MODEL", "gpt-5-nano")
    assert Settings().summarizer_model == "gpt-5-nano"
    assert Settings(summarizer="anthropic", anthropic_api_key="k").summarizer_model == \
        "gpt-5-nano"


def test_the_openai_summarizer_without_a_key_says_what_to_set() -> None:
    with pytest.raises(InvalidInputError, match="OPENAI_API_KEY") as info:
        Settings(summarizer="openai")
    assert "SESSIONFOLD_SUMMARIZER=offline" in str(info.value)


@pytest.mark.parametrize("model", ["llama3.1:8b", "gpt-5-pro", "gpt-5.4-mini"])
def test_a_summarizer_model_without_prices_is_refused_at_start(model: str) -> None:
    with pytest.raises(InvalidInputError, match=r"SESSIONFOLD_SUMMARIZER_MODEL: no prices for "
                       rf"summarizer model '{re.escape(model)}'.*SESSIONFOLD_PRICES"):
        Settings(summarizer="openai", openai_api_key="k", summarizer_model=model)
    # Priced in the settings, it is taken; the offline summarizer calls no model at all.
    priced = Settings(summarizer="openai", openai_api_key="k", summarizer_model=model,
                      prices={model: {"input_per_mtok": 0, "output_per_mtok": 0}})
    assert priced.summarizer_model == model
    assert Settings(summarizer="offline", summarizer_model=model).summarizer_model == model


@pytest.mark.parametrize("model", ["gpt-4.1-mini-2025-04-14", "openai/gpt-4o-mini",
                                   "anthropic.claude-haiku-4-5-20251001-v1:0",
                                   "claude-3-5-haiku-latest"])
def test_a_summarizer_model_of_a_known_family_is_taken(model: str) -> None:
    settings = Settings(summarizer="openai", openai_api_key="k", summarizer_model=model)
    assert settings.summarizer_model == model


def test_repr_and_str_hide_every_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-topsecret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-topsecret")
    monkeypatch.setenv("DATABASE_URL", "postgresql://app:dbpass123@db:5432/sessions")
    monkeypatch.setenv("REDIS_URL", "redis://:redispass456@cache:6379/0")
    monkeypatch.setenv("SESSIONFOLD_FLOWER_BASIC_AUTH", "ops:flowerpass789")
    settings = Settings()
    for text in (repr(settings), str(settings), f"{settings}"):
        for secret in ("sk-ant-topsecret", "sk-openai-topsecret", "dbpass123", "redispass456",
                       "flowerpass789"):
            assert secret not in text
        assert "postgresql://app:***@db:5432/sessions" in text
        assert "redis://:***@cache:6379/0" in text
    # The values themselves are intact for the code that needs them.
    assert settings.database_url == "postgresql://app:dbpass123@db:5432/sessions"
    assert settings.flower_basic_auth is not None
    assert settings.flower_basic_auth.get_secret_value() == "ops:flowerpass789"


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://app:s3cret@db:5432/x", "postgresql://app:***@db:5432/x"),
    ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
    ("redis://cache:6379/0?password=s3cret&db=1", "redis://cache:6379/0?password=***&db=1"),
    ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
    ("unix:///tmp/redis.sock", "unix:///tmp/redis.sock"),
])
def test_redact_url_masks_passwords_only(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize(("overrides", "names"), [
    ({"task_time_limit_s": 2000, "task_soft_time_limit_s": 1900},
     ["SESSIONFOLD_TASK_TIME_LIMIT_S", "SESSIONFOLD_VISIBILITY_TIMEOUT_S", "half"]),
    ({"task_soft_time_limit_s": 400},
     ["SESSIONFOLD_TASK_SOFT_TIME_LIMIT_S", "below", "SESSIONFOLD_TASK_TIME_LIMIT_S"]),
    ({"lock_ttl_s": 100},
     ["SESSIONFOLD_LOCK_TTL_S", "must exceed", "SESSIONFOLD_TASK_TIME_LIMIT_S"]),
    ({"retry_backoff_cap_s": 3500},
     ["SESSIONFOLD_RETRY_BACKOFF_CAP_S", "SESSIONFOLD_VISIBILITY_TIMEOUT_S", "twice"]),
    ({"retry_backoff_base_s": 500, "retry_backoff_cap_s": 400},
     ["SESSIONFOLD_RETRY_BACKOFF_BASE_S", "SESSIONFOLD_RETRY_BACKOFF_CAP_S"]),
    ({"flower_basic_auth": "justauser"}, ["SESSIONFOLD_FLOWER_BASIC_AUTH", "user:password"]),
    ({"scheduler_block_ms": 3_000, "scheduler_claim_idle_ms": 2_000},
     ["SESSIONFOLD_SCHEDULER_BLOCK_MS", "SESSIONFOLD_SCHEDULER_CLAIM_IDLE_MS"]),
    ({"scheduler_block_ms": 60_000}, ["SESSIONFOLD_SCHEDULER_BLOCK_MS", "less than or equal"]),
    ({"worker_concurrency": 0}, ["SESSIONFOLD_WORKER_CONCURRENCY", "greater than or equal to 1"]),
    ({"summarizer": "gpt"}, ["SESSIONFOLD_SUMMARIZER", "'anthropic', 'openai' or 'offline'"]),
    ({"no_such_setting": 1}, ["no_such_setting", "unknown setting"]),
])
def test_invalid_values_name_the_variable_and_the_rule(overrides: dict[str, object],
                                                       names: list[str]) -> None:
    with pytest.raises(InvalidInputError) as info:
        Settings(**overrides)
    message = str(info.value)
    assert message.startswith("invalid settings: ")
    for name in names:
        assert name in message


def test_a_bad_environment_value_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SESSIONFOLD_TASK_TIME_LIMIT_S", "five minutes")
    with pytest.raises(InvalidInputError, match=r"SESSIONFOLD_TASK_TIME_LIMIT_S: .*number"):
        Settings()


def test_a_validation_error_never_echoes_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-leakme")
    monkeypatch.setenv("SESSIONFOLD_FLOWER_BASIC_AUTH", "nocolonleakme")
    with pytest.raises(InvalidInputError) as info:
        Settings()
    assert "leakme" not in str(info.value)


def test_short_limits_for_tests_are_accepted_when_consistent() -> None:
    settings = Settings(visibility_timeout_s=10, task_time_limit_s=5, task_soft_time_limit_s=4,
                        retry_backoff_base_s=0.1, retry_backoff_cap_s=2, lock_ttl_s=8)
    assert settings.visibility_timeout_s == 10


def test_data_dir_is_made_absolute_before_anything_forks(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = Settings(data_dir="state")
    assert settings.data_dir == tmp_path / "state"
    assert settings.data_dir.is_absolute()


def test_settings_are_immutable() -> None:
    settings = Settings()
    with pytest.raises(ValueError, match="frozen"):
        settings.worker_concurrency = 9  # type: ignore[misc]


def test_env_name_maps_fields_to_variables() -> None:
    assert env_name("redis_url") == "REDIS_URL"
    assert env_name("lock_ttl_s") == "SESSIONFOLD_LOCK_TTL_S"
    assert set(Settings.model_fields) >= {"database_url", "redis_url", "anthropic_api_key"}


#: Passwords with every character that ends a URL part somewhere: / # ? @ : %.
_HARD_PASSWORDS = ["Sekr/etWord", "Sekr#etWord", "Sekr?etWord", "Sekr@etWord", "Sekr:etWord",
                   "Sekr%etWord", "Qzx/Kvw#Jqp?Wzk@Xjv:Zqy%Vbn"]
_URL_SETTINGS = {
    "database_url": ("postgresql+psycopg://app:{pw}@db.internal:5432/sessions", "db.internal"),
    "redis_url": ("redis://app:{pw}@cache.internal:6379/0", "cache.internal"),
    "anthropic_base_url": ("https://proxy:{pw}@llm.internal/v1", "llm.internal"),
    "openai_base_url": ("https://gateway:{pw}@chat.internal/v1", "chat.internal"),
}


@pytest.mark.parametrize("field", sorted(_URL_SETTINGS))
@pytest.mark.parametrize("password", _HARD_PASSWORDS)
@pytest.mark.parametrize("escaped", [True, False], ids=["percent-encoded", "raw"])
def test_no_url_setting_shows_a_password_whatever_characters_it_holds(
        field: str, password: str, escaped: bool) -> None:
    from urllib.parse import quote

    template, host = _URL_SETTINGS[field]
    url = template.format(pw=quote(password, safe="") if escaped else password)
    text = repr(Settings(**{field: url}))
    # Not the password, nor any piece of it a parser might have cut off and shown as a host,
    # a path, a query or a fragment.
    pieces = [p for p in re.split(r"[/#?@:%]", password) if len(p) > 1]
    for secret in [password, quote(password, safe=""), *pieces]:
        assert secret not in text, f"{field}={url!r} shows {secret!r}: {text}"
    if escaped:  # a well-formed URL still says where it points
        assert host in text
