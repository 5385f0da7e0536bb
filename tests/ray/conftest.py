"""tests/ray's fixtures (raysupport.py): a 2-node Ray cluster per module,
and a leak check that replaces the suite-wide one."""

from raysupport import no_leaks, node_options, nodes

__all__ = ["no_leaks", "node_options", "nodes"]
