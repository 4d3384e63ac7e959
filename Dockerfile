FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY executor ./executor
COPY tasks ./tasks
COPY fallback ./fallback
RUN pip install --no-cache-dir '.[ops]'
# Tools live in the deployer's own modules: mount them and name them in TOOLEXEC_TOOLS.
ENV PYTHONPATH=/tools
# Tool code runs here: not as root.
RUN useradd --create-home --uid 10001 toolexec
USER toolexec
CMD ["toolexec", "worker"]
