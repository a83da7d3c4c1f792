"""`ashd runner`: a local sandbox pool and session actors behind the runner API, registered with a
coordinator (docs/protocol.md "Runner API", docs/architecture.md)."""

from ashd.runner._local_pool import LocalPoolRunner
from ashd.runner._process import RunnerProcess, advertised_host, run_runner
from ashd.runner._registration import Registration, RunnerIdentity

__all__ = ["LocalPoolRunner", "Registration", "RunnerIdentity", "RunnerProcess", "advertised_host", "run_runner"]
