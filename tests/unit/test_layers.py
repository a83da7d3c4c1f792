"""The package layers as a rule: a module imports only from its own layer or the ones below it.

    composition   ashd.app, ashd.__main__, ashd.cli, ashd.devtools, ashd.runner   (nothing imports these)
    http          ashd.http                                  (only the composition imports it)
    wiring        ashd.components, ashd.runtime, ashd._bootstrap
    backends      ashd.backends                              (the seam the HTTP layer talks to)
    actors        ashd.actors
    resources     ashd.sandboxing, ashd.storage, ashd.config, ashd.metrics
    base          ashd (the package root), ashd.errors, ashd.logs, ashd.pricing, ashd.model_names,
                  ashd.engines, ashd.bridge, ashd.zygote

`ashd.bridge` runs inside the sandbox: it imports nothing of the server, only itself and the
shared leaves (`ashd`, `ashd.pricing`, `ashd.model_names`, `ashd.engines`). `ashd.zygote`, the fork
server every sandbox is a copy of, imports only itself and `ashd`: its image is what each sandbox's
fork copies and each exit unmaps. Imports under `TYPE_CHECKING` and
inside functions count: they are dependencies all the same.

A package's `_private` modules are its own: other packages import what its `__init__` names in
`__all__` (the check is per top-level package: `ashd.storage`, `ashd.actors`, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

import ashd

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("composition", ("ashd.app", "ashd.__main__", "ashd.cli", "ashd.devtools", "ashd.runner")),
    ("http", ("ashd.http",)),
    ("wiring", ("ashd.components", "ashd.runtime", "ashd._bootstrap")),
    ("backends", ("ashd.backends",)),
    ("actors", ("ashd.actors",)),
    ("resources", ("ashd.sandboxing", "ashd.storage", "ashd.config", "ashd.metrics")),
    ("base", ("ashd.errors", "ashd.logs", "ashd.pricing", "ashd.model_names", "ashd.engines", "ashd.bridge",
              "ashd.zygote", "ashd")),
)
BRIDGE_MAY_IMPORT = ("ashd.bridge", "ashd.pricing", "ashd.model_names", "ashd.engines")
ZYGOTE_MAY_IMPORT = ("ashd.zygote",)
ROOT = Path(ashd.__file__).parent


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> int:
    """Index into LAYERS (0 is the top); the longest matching prefix wins (`ashd` matches all)."""
    best, best_len = len(LAYERS) - 1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if _within(module, prefix) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def imports_of(source: str) -> list[str]:
    """The `ashd` modules a module's source imports (absolute imports: the house writes no other)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _within(node.module, "ashd"):
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names if _within(alias.name, "ashd"))
    return found


def _package(module: str) -> str:
    """The top-level package of an `ashd` module (`ashd.storage._files` -> `ashd.storage`)."""
    return ".".join(module.split(".")[:2])


def _private_elsewhere(module: str, target: str) -> bool:
    """`target` is a private module of another top-level package than `module`'s."""
    parts = target.split(".")
    return (_package(target) != _package(module) and len(parts) > 2
            and any(part.startswith("_") for part in parts[2:]))


def violations(module: str, source: str) -> list[str]:
    out: list[str] = []
    own = layer_of(module)
    for target in imports_of(source):
        if _private_elsewhere(module, target):
            out.append(f"{module} imports {target}, a private module of {_package(target)}: import what "
                       f"{_package(target)}.__all__ names instead")
        if _within(module, "ashd.bridge"):
            if not (target == "ashd" or any(_within(target, p) for p in BRIDGE_MAY_IMPORT)):
                out.append(f"{module} imports {target}: the bridge runs in the sandbox and imports nothing "
                           "of the server")
            continue
        if _within(module, "ashd.zygote"):
            if not (target == "ashd" or any(_within(target, p) for p in ZYGOTE_MAY_IMPORT)):
                out.append(f"{module} imports {target}: every sandbox is a fork of the fork server, which "
                           "imports nothing of the server")
            continue
        theirs = layer_of(target)
        if theirs < own:
            out.append(f"{module} ({LAYERS[own][0]}) imports {target} ({LAYERS[theirs][0]}), a layer above it")
    return out


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_no_module_imports_from_a_layer_above_it() -> None:
    found: list[str] = []
    for path in sorted(ROOT.rglob("*.py")):
        found += violations(_module_name(path), path.read_text(encoding="utf-8"))
    assert found == []


def test_the_check_catches_forbidden_imports() -> None:
    assert violations("ashd.storage._sessions", "from ashd.http._keys import COMPONENTS\n")
    assert violations("ashd.actors._session", "import ashd.backends\n")
    assert violations("ashd.backends._local", "def f():\n    from ashd.components import Components\n")
    assert violations("ashd.bridge._server", "from ashd.storage import Database\n")
    assert violations("ashd.bridge.engine._loop", "from ashd.errors import BadRequest\n")
    assert violations("ashd.zygote._child", "from ashd.sandboxing import SANDBOX_UID\n")
    assert violations("ashd.zygote._fork_server", "from ashd.errors import SandboxError\n")
    assert violations("ashd.runtime", "from ashd.http import build_app\n")
    assert violations("ashd.http._sessions", "from ashd.storage._sessions import Sessions\n")
    assert violations("ashd.runtime", "from ashd.actors._pool import PoolActor\n")


def test_the_check_allows_imports_downwards_and_within_a_layer() -> None:
    assert violations("ashd.http._sessions", "from ashd.backends import NewSession\n") == []
    assert violations("ashd.sandboxing._agent_setup", "from ashd.storage import open_dir\n") == []
    assert violations("ashd.bridge.engine._loop", "from ashd.pricing import PriceTable\nimport ashd\n") == []
    assert violations("ashd.app", "from ashd.http import build_app\n") == []
    assert violations("ashd.storage._agents", "from ashd.storage._agent_paths import open_dir\n") == []
