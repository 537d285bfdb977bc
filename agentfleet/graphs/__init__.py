"""Graphs on the fleet: nodes, conditional edges, joins and maps over typed state, each node a checkpointed
step (DESIGN.md §14). ``Graph`` builds one, ``register_graph`` checks it and makes it an agent the fleet runs."""

from agentfleet.graphs.binding import GraphModel, register_graph
from agentfleet.graphs.definition import END, START, Graph, NodePolicy
from agentfleet.graphs.mermaid import mermaid
from agentfleet.graphs.state import Reducer, append, maximum, merge, minimum, reducer
from agentfleet.graphs.validation import check, problems

__all__ = [
           "END",
           "START",
           "Graph",
           "GraphModel",
           "NodePolicy",
           "Reducer",
           "append",
           "check",
           "maximum",
           "merge",
           "mermaid",
           "minimum",
           "problems",
           "reducer",
           "register_graph",
]
