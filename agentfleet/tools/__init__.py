"""What tool authors write: ``@tool`` and its options, manifests for tools in any language, health checks,
approval rules, the workspace, and the built-in tools (delegate, read_artifact). Declarations are data; the
harness decides how to run them."""
