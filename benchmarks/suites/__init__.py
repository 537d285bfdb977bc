"""One module per suite; each exposes ``run(sizes, report)``."""
