"""The operator API the CLI (and a console) share: submit and follow goals, trace runs, dead letters, control of
the workers. Reads through the store and the broker; prints nothing."""
