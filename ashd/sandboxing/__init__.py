"""Sandbox lifecycle: isolation (bwrap or a zygote), cgroup limits, the shutdown ladder."""

from ashd.sandboxing._agent_setup import prepare_workspace, small_agent
from ashd.sandboxing._bridge_client import BridgeConnection
from ashd.sandboxing._cgroups import CgroupTree, SandboxCgroup, detect_version
from ashd.sandboxing._egress_policy import BLOCKED_V4, EgressPolicy, parse_allow, parse_dns, parse_subnet
from ashd.sandboxing._isolation import isolation_problems, probe_isolation
from ashd.sandboxing._launcher import LEFTOVER_DETACH_SECONDS, LauncherConfig, SandboxLauncher
from ashd.sandboxing._layout import SANDBOX_GID, SANDBOX_UID
from ashd.sandboxing._meter import LimitNotice
from ashd.sandboxing._model_budget import TurnSummary
from ashd.sandboxing._model_policy import ModelBinding, ModelPolicy, parse_tenant_budgets, session_models
from ashd.sandboxing._model_proxy import ModelProxy
from ashd.sandboxing._process import SandboxProcess
from ashd.sandboxing._reaper import reap_leftovers
from ashd.sandboxing._types import (
    BRIDGE_SOCKET,
    MODEL_SOCKET,
    SANDBOX_HOME,
    SANDBOX_RUN,
    SANDBOX_WORKSPACE,
    ExitInfo,
    ExitReason,
    IsolationReport,
    SandboxLimits,
    SandboxPaths,
    SandboxSpec,
    ShutdownRung,
)
from ashd.sandboxing._upstream import UpstreamRoute, upstream_route
from ashd.sandboxing._webhook_targets import (
    GuardedResolver,
    TargetRefused,
    WebhookTargets,
    describe_failure,
    parse_webhook_allow,
    split_url,
)
from ashd.storage import ModelCallRecord

__all__ = [
    "BLOCKED_V4",
    "BRIDGE_SOCKET",
    "LEFTOVER_DETACH_SECONDS",
    "MODEL_SOCKET",
    "SANDBOX_GID",
    "SANDBOX_HOME",
    "SANDBOX_RUN",
    "SANDBOX_UID",
    "SANDBOX_WORKSPACE",
    "BridgeConnection",
    "CgroupTree",
    "EgressPolicy",
    "ExitInfo",
    "ExitReason",
    "GuardedResolver",
    "IsolationReport",
    "LauncherConfig",
    "LimitNotice",
    "ModelBinding",
    "ModelCallRecord",
    "ModelPolicy",
    "ModelProxy",
    "SandboxCgroup",
    "SandboxLauncher",
    "SandboxLimits",
    "SandboxPaths",
    "SandboxProcess",
    "SandboxSpec",
    "ShutdownRung",
    "TargetRefused",
    "TurnSummary",
    "UpstreamRoute",
    "WebhookTargets",
    "describe_failure",
    "detect_version",
    "isolation_problems",
    "parse_allow",
    "parse_dns",
    "parse_subnet",
    "parse_tenant_budgets",
    "parse_webhook_allow",
    "prepare_workspace",
    "probe_isolation",
    "reap_leftovers",
    "session_models",
    "small_agent",
    "split_url",
    "upstream_route",
]
