# syntax=docker/dockerfile:1
# SpecPilot's images, one multi-stage file. Targets:
#
#   docker build --target controller     -t specpilot/controller .      # REST API, dashboard, /metrics (8700)
#   docker build --target memory-api     -t specpilot/memory-api .      # the memory's REST API (8710)
#   docker build --target celery-worker  -t specpilot/celery-worker .   # the rounds (queue rounds.<kind>), metrics 9101
#   docker build --target planner        -t specpilot/planner .         # the planner's tasks (queue planner), metrics 9101
#   docker build --target gpu-worker     -t specpilot/gpu-worker .      # gRPC GpuWorker on one CUDA device (50051), metrics 9100
#
# Every image carries the repository at /opt/specpilot/src as a one-commit git repository (the
# GPU workers build patched systems from it, the memory API checks reproductions against it): the
# commit's dates are fixed, so every image built from one tree agrees on the stock revision.
# Base images are pinned by version; pin them by digest as well (`@sha256:…`) where your registry
# policy asks for it. The final stages hold no compiler, run as user `specpilot` (uid 10001) and
# have a HEALTHCHECK each (python -m specpilot.entrypoints.healthcheck).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG TORCH_VERSION=2.13.0
# the CUDA build of torch for the GPU worker: cu128 has kernels for sm_90 (H100) and sm_120 (RTX PRO 6000)
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

# ---------------------------------------------------------------- the source as a git repository
FROM ${PYTHON_IMAGE} AS source
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/specpilot/src
COPY . .
RUN git init -q -b main \
    && git add -A \
    && GIT_AUTHOR_DATE=2000-01-01T00:00:00Z GIT_COMMITTER_DATE=2000-01-01T00:00:00Z \
       git -c user.name=specpilot -c user.email=specpilot@localhost commit -q -m "specpilot image" \
    && git gc -q

# ---------------------------------------------------------------- CPU services: build the virtual environment
FROM ${PYTHON_IMAGE} AS cpu-build
ARG TORCH_VERSION
ARG TORCH_CPU_INDEX
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --index-url "${TORCH_CPU_INDEX}" "torch==${TORCH_VERSION}"
COPY --from=source /opt/specpilot/src /opt/specpilot/src
RUN pip install -e "/opt/specpilot/src[services]"

# ---------------------------------------------------------------- CPU services: the common runtime
FROM ${PYTHON_IMAGE} AS cpu-runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin specpilot \
    && mkdir -p /var/lib/specpilot \
    && chown specpilot:specpilot /var/lib/specpilot
COPY --from=cpu-build /opt/venv /opt/venv
COPY --from=source --chown=specpilot:specpilot /opt/specpilot/src /opt/specpilot/src
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    SPECPILOT_REPO=/opt/specpilot/src \
    SPECPILOT_DATA=/var/lib/specpilot
WORKDIR /var/lib/specpilot
USER 10001:10001

# ---------------------------------------------------------------- controller: REST API, dashboard, /metrics
FROM cpu-runtime AS controller
EXPOSE 8700
HEALTHCHECK --interval=15s --timeout=6s --start-period=30s --retries=3 \
    CMD ["python", "-m", "specpilot.entrypoints.healthcheck", "http://127.0.0.1:8700/healthz"]
CMD ["specpilot", "serve", "controller", "--host", "0.0.0.0", "--port", "8700"]

# ---------------------------------------------------------------- memory API (seeds an empty memory first)
FROM cpu-runtime AS memory-api
EXPOSE 8710
HEALTHCHECK --interval=15s --timeout=6s --start-period=30s --retries=3 \
    CMD ["python", "-m", "specpilot.entrypoints.healthcheck", "http://127.0.0.1:8710/metrics"]
CMD ["sh", "-c", "specpilot memory seed --store \"$SPECPILOT_MEMORY_URL\" >/dev/null && exec specpilot serve memory-api --store \"$SPECPILOT_MEMORY_URL\" --host 0.0.0.0 --port 8710 --repo \"$SPECPILOT_REPO\" --stock-rev \"$(git -C \"$SPECPILOT_REPO\" rev-parse HEAD)\""]

# ---------------------------------------------------------------- Celery worker of the rounds (CMD: the queue)
FROM cpu-runtime AS celery-worker
ENV SPECPILOT_METRICS_PORT=9101 SPECPILOT_METRICS_HOST=0.0.0.0
EXPOSE 9101
HEALTHCHECK --interval=15s --timeout=6s --start-period=60s --retries=3 \
    CMD ["sh", "-c", "exec python -m specpilot.entrypoints.healthcheck \"http://127.0.0.1:${SPECPILOT_METRICS_PORT}/metrics\""]
ENTRYPOINT ["celery", "-A", "specpilot.entrypoints.rounds_worker", "worker", "--pool", "solo", "--concurrency", "1", \
            "--without-gossip", "--without-mingle", "--loglevel", "INFO", "-n", "rounds@%h"]
CMD ["-Q", "rounds.h100-sxm"]

# ---------------------------------------------------------------- planner (Celery, queue planner)
FROM cpu-runtime AS planner
ENV SPECPILOT_METRICS_PORT=9101 SPECPILOT_METRICS_HOST=0.0.0.0
EXPOSE 9101
HEALTHCHECK --interval=15s --timeout=6s --start-period=60s --retries=3 \
    CMD ["sh", "-c", "exec python -m specpilot.entrypoints.healthcheck \"http://127.0.0.1:${SPECPILOT_METRICS_PORT}/metrics\""]
CMD ["celery", "-A", "specpilot.services.planner.tasks", "worker", "-Q", "planner", "--pool", "solo", \
     "--concurrency", "1", "--without-gossip", "--without-mingle", "--loglevel", "INFO", "-n", "planner@%h"]

# ---------------------------------------------------------------- GPU worker: build on the CUDA runtime
FROM ${CUDA_IMAGE} AS gpu-build
ARG TORCH_VERSION
ARG TORCH_INDEX
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"
COPY --from=source /opt/specpilot/src /opt/specpilot/src
# the worker needs only the core dependencies (torch, grpcio, protobuf, prometheus-client, ...)
RUN pip install -e /opt/specpilot/src

# ---------------------------------------------------------------- GPU worker: runtime (one device: cuda:0 of its container)
FROM ${CUDA_IMAGE} AS gpu-worker
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 git \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin specpilot
COPY --from=gpu-build /opt/venv /opt/venv
COPY --from=source --chown=specpilot:specpilot /opt/specpilot/src /opt/specpilot/src
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    SPECPILOT_REPO=/opt/specpilot/src \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /home/specpilot
USER 10001:10001
EXPOSE 50051 9100
HEALTHCHECK --interval=15s --timeout=6s --start-period=60s --retries=3 \
    CMD ["python", "-m", "specpilot.entrypoints.healthcheck", "grpc://127.0.0.1:50051"]
ENTRYPOINT ["python", "-m", "specpilot.services.gpu_worker.server", "--host", "0.0.0.0", "--port", "50051", \
            "--metrics-port", "9100", "--repo", "/opt/specpilot/src"]
# the device kind the worker advertises (its rounds queue is rounds.<kind>): h100-sxm, h200, rtx-pro-6000
CMD ["--device", "cuda:0", "--kind", "h100-sxm"]
