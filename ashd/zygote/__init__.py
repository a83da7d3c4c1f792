"""The fork server every zygote-route sandbox is forked from, and what its child does to become one.

Kept apart from `ashd.sandboxing` on purpose: importing a module of a package runs the package's
`__init__`, and `ashd.sandboxing`'s pulls in the launcher, the model proxy, storage, SQLAlchemy,
aiohttp's server and pyroute2. The fork server's image is what every sandbox copies: each fork
copies its page tables, each sandbox's first writes copy its pages, each exit unmaps it. So this
package imports only the standard library and itself; the bridge, which every sandbox runs, is
preloaded on top (docs/performance.md, twenty-fourth pass).
"""

from ashd.zygote._child import PASSED_FD
from ashd.zygote._mounts import HOSTNAME, SANDBOX_GID, SANDBOX_UID, Mount

__all__ = ["HOSTNAME", "PASSED_FD", "SANDBOX_GID", "SANDBOX_UID", "Mount"]
