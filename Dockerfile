FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY agentfleet ./agentfleet
RUN pip install --no-cache-dir . && useradd --create-home agentfleet
USER agentfleet
ENV AGENTFLEET_WORKSPACE=/app
ENTRYPOINT ["agentfleet"]
