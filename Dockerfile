FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY executor ./executor
COPY tasks ./tasks
COPY fallback ./fallback
RUN pip install --no-cache-dir .
# Tools live in the deployer's own modules: mount them and name them in TOOLEXEC_TOOLS.
ENV PYTHONPATH=/tools
CMD ["toolexec", "worker"]
