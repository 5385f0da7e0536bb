"""trunner on a Ray cluster: one jailed pool per node, used as one pool.

`cluster_pool(...)` is for trio callers, `AsyncioPool(...)` for asyncio ones
(Ray actors, RL rollouts); both route each call to the live node with the
fewest calls in flight. Importing this imports Ray (the `ray` extra:
`pip install 'trunner-sandbox[ray]'`); `import trunner` never does.
"""

from trunner.ray.aio import AsyncioPool
from trunner.ray.pool import ClusterPool, cluster_pool

__all__ = ["AsyncioPool", "ClusterPool", "cluster_pool"]
