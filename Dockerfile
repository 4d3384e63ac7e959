FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY executor ./executor
COPY tasks ./tasks
COPY fallback ./fallback
# Every command and setting the docs describe works in the image: ops (worker, flower,
# status, ...), mcp (`toolexec mcp`, `worker --mcp-server`), otel (OTLP trace export) and
# s3 (TOOLEXEC_PAYLOAD_STORE=s3://...). Not sdks (agent processes), dev, e2e, bench, preview.
RUN pip install --no-cache-dir '.[ops,mcp,otel,s3]'
# Tools live in the deployer's own modules: mount them and name them in TOOLEXEC_TOOLS.
ENV PYTHONPATH=/tools
# Tool code runs here: not as root.
RUN useradd --create-home --uid 10001 toolexec
USER toolexec
CMD ["toolexec", "worker"]
