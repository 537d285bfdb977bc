FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY agentfleet ./agentfleet
RUN pip install --no-cache-dir . && useradd --create-home agentfleet && mkdir -p /app/agents
USER agentfleet
# Your agents: mount a directory at /app/agents (docker-compose.yml does) or COPY into it, and name
# the modules in AGENTFLEET_AGENTS.
ENV AGENTFLEET_WORKSPACE=/app PYTHONPATH=/app/agents
ENTRYPOINT ["agentfleet"]
