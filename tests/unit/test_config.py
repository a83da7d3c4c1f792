"""Configuration: every variable parsed, bad values named, unknown names suggested."""

from __future__ import annotations

import pytest

from ashd.config import OPTIONS, Settings, load_settings, options_markdown
from ashd.errors import ConfigError


def test_defaults() -> None:
    s = load_settings({})
    assert s == Settings()
    assert s.port == 4100 and s.mode == "standalone" and s.effective_database_url.startswith("sqlite+aiosqlite:///")


def test_every_interface_variable_is_read() -> None:
    env = {
        "SERVICE_MODE": "coordinator", "SERVICE_DATABASE_URL": "postgresql://u@h/db", "SERVICE_API_KEY": "k",
        "SERVICE_INTERNAL_SECRET": "s", "SERVICE_MAX_SANDBOXES": "7", "SERVICE_SNAPSHOT_URL": "s3://b/p",
        "SERVICE_DEBUG_TIMING": "1", "SERVICE_RUNNER_ID": "r1", "SERVICE_SERVER_URL": "http://c:4100/",
        "SERVICE_RUNNER_PORT": "4201", "SERVICE_RUNNER_ADVERTISE_HOST": "10.0.0.2",
    }
    s = load_settings(env)
    assert (s.mode, s.database_url, s.api_key, s.internal_secret, s.max_sandboxes, s.snapshot_url) == (
        "coordinator", "postgresql://u@h/db", "k", "s", 7, "s3://b/p")
    assert s.debug_timing and s.runner_id == "r1" and s.server_url == "http://c:4100"
    assert s.runner_port == 4201 and s.runner_advertise_host == "10.0.0.2"


@pytest.mark.parametrize(("name", "value", "accepts"), [
    ("SERVICE_PORT", "99999", "port"),
    ("SERVICE_MAX_SANDBOXES", "0", "integer ≥ 1"),
    ("SERVICE_MODE", "cluster", "`standalone` or `coordinator`"),
    ("SERVICE_DEBUG_TIMING", "maybe", "boolean"),
    ("SERVICE_SNAPSHOT_URL", "ftp://x", "s3://"),
    ("SERVICE_DATABASE_URL", "mysql://x", "SQLAlchemy URL"),
])
def test_bad_value_names_variable_and_what_it_accepts(name: str, value: str, accepts: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings({name: value})
    assert name in str(err.value) and accepts in str(err.value)


def test_secret_values_are_not_echoed() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings({"SERVICE_MODE": "coordinator"})
    assert "SERVICE_INTERNAL_SECRET" in str(err.value)
    assert "hunter2" not in repr(Settings(api_key="hunter2"))


def test_unknown_variable_gets_a_suggestion() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings({"SERVICE_PROT": "4100"})
    assert "SERVICE_PORT" in str(err.value)


def test_markdown_table_lists_every_option() -> None:
    table = options_markdown()
    for opt in OPTIONS:
        assert f"`{opt.env}`" in table


@pytest.mark.parametrize("runner_env", [{"SERVICE_SERVER_URL": "http://coordinator:4100"}, {"SERVICE_RUNNER_ID": "r1"}])
def test_a_runner_refuses_to_start_without_the_shared_secret(runner_env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(runner_env)
    assert "SERVICE_INTERNAL_SECRET must be set on a runner" in str(err.value)
    assert load_settings({**runner_env, "SERVICE_INTERNAL_SECRET": "s" * 32}).internal_secret == "s" * 32
