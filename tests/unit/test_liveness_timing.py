"""The liveness sweep's wait: the sweep interval plus a jitter drawn anew each time, 0 to the setting."""

from __future__ import annotations

import pytest

from ashd.actors import LivenessConfig, RunnerLiveness
from ashd.config import load_settings
from ashd.errors import ConfigError


def test_wait_is_interval_plus_jitter() -> None:
    draws = iter([0.0, 1.0, 0.5])
    liveness = RunnerLiveness(None, LivenessConfig(30.0, 10.0, 4.0), rand=lambda: next(draws))  # type: ignore[arg-type]
    assert [liveness.next_wait() for _ in range(3)] == [10.0, 14.0, 12.0]


def test_settings_and_their_defaults() -> None:
    default = load_settings({})
    assert (default.runner_liveness_seconds, default.runner_sweep_seconds,
            default.runner_sweep_jitter_seconds) == (30.0, 30.0, 5.0)
    tuned = load_settings({"SERVICE_RUNNER_LIVENESS_SECONDS": "1.5", "SERVICE_RUNNER_SWEEP_SECONDS": "0.5",
                           "SERVICE_RUNNER_SWEEP_JITTER_SECONDS": "0", "SERVICE_SERVER_ID": "edge-1"})
    assert (tuned.runner_liveness_seconds, tuned.runner_sweep_seconds, tuned.runner_sweep_jitter_seconds,
            tuned.server_id) == (1.5, 0.5, 0.0, "edge-1")
    for name, bad in (("SERVICE_RUNNER_LIVENESS_SECONDS", "0"), ("SERVICE_RUNNER_SWEEP_JITTER_SECONDS", "-1")):
        with pytest.raises(ConfigError, match=name):
            load_settings({name: bad})
