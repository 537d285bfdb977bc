FROM python:3.11-slim
WORKDIR /app
# bubblewrap: the sandbox subprocess tools run in; Node.js and jq: the example tools in Node and Bash.
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap nodejs jq \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY agentfleet ./agentfleet
RUN pip install --no-cache-dir . && useradd --create-home agentfleet \
    && mkdir -p /app/agents /app/plugins /app/workspace && chown agentfleet /app/workspace
USER agentfleet
# Your agents: mount a directory at /app/agents (docker-compose.yml does) or COPY into it, and name
# the modules in AGENTFLEET_AGENTS.
ENV AGENTFLEET_WORKSPACE=/app/workspace PYTHONPATH=/app/agents
ENTRYPOINT ["agentfleet"]
