"""Enforcement: the sandbox a subprocess runs in (bubblewrap), its per-call bounds (uid, cgroup, rlimits) and the
process plumbing. It confines a process; it knows nothing of tools."""
