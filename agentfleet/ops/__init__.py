"""The operator API the CLI, the console and the Python client share: submit and follow goals, pages of runs, trace
runs, approvals, dead letters, control of the workers, activity, and every operator action (``actions``, each
recorded with who did it). Reads through the store and the broker; prints nothing."""
