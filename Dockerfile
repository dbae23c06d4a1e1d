# s3batch worker image.
#
#   docker build -t s3batch-worker .
#   docker run --env-file worker.env s3batch-worker
#
# Configuration is the environment only (TEMPORAL_*, AWS_*, S3BATCH_*): see docs/how-to/deploy.md.
#
# BASE_IMAGE: any Debian-based image with Python 3.11 as `python3` (the default, pinned; or a base
# built from Debian packages, as `make test-container` does where no registry can be reached).
# PIP_INDEX_URL (optional): the package index the build installs from, when not the default one.
# Few layers on purpose: every layer is a full copy on storage drivers such as vfs.
ARG BASE_IMAGE=python:3.11.15-slim-bookworm

# ---------------------------------------------------------------------------- build stage
FROM ${BASE_IMAGE} AS build
ARG PIP_INDEX_URL

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/venv/bin:$PATH

# Dependencies first, from the hashed lock of pyproject.toml's pins (requirements.lock, made by
# pip-compile --generate-hashes): this layer is rebuilt only when the dependencies change, and every
# file pip installs must match its hash.
COPY pyproject.toml requirements.lock /src/
RUN python3 -m venv /opt/venv \
    && pip install --no-cache-dir -r /src/requirements.lock --require-hashes --no-deps

# Then the source (the build context is .dockerignore's allow-list), installed without dependencies
# (they are all in the layer above).
COPY . /src/
RUN pip install --no-cache-dir --no-deps /src \
    && python -m compileall -q /opt/venv/lib

# ---------------------------------------------------------------------------- runtime stage
FROM ${BASE_IMAGE}

# GIT_COMMIT: the commit the image is built from (docker build --build-arg GIT_COMMIT=$(git rev-parse HEAD)).
# With Worker Versioning on (S3BATCH_DEPLOYMENT_NAME set) and no S3BATCH_BUILD_ID, the worker's build ID
# is the package version and this commit, so every image build is a version of its own (s3batch/versioning.py).
ARG GIT_COMMIT=""

# A fixed numeric uid/gid, so Kubernetes can verify runAsNonRoot without resolving a name.
RUN groupadd --system --gid 10001 s3batch \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin s3batch

COPY --from=build /opt/venv /opt/venv

# S3BATCH_HEALTH_FILE: where the worker keeps its heartbeat (s3batch/health.py); /tmp is the one
# place a non-root user (or a read-only root filesystem with an emptyDir on /tmp) can write.
ENV PATH=/opt/venv/bin:$PATH \
    S3BATCH_GIT_COMMIT=${GIT_COMMIT} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    S3BATCH_HEALTH_FILE=/tmp/s3batch-health.json

USER 10001:10001

# The worker handles SIGTERM itself: it stops polling at once, lets in-flight files reach a chunk
# boundary and hand over, and cancels whatever is left after S3BATCH_GRACEFUL_SHUTDOWN_SECONDS
# (default 30). Give the container that long plus a margin before SIGKILL:
#   docker stop -t 45, compose stop_grace_period: 45s, Kubernetes terminationGracePeriodSeconds: 45.
STOPSIGNAL SIGTERM

# Healthy = the worker is polling its task queue and the Temporal frontend answered within the last
# 30 s (the worker rewrites the heartbeat file every 5 s). Starting takes a few seconds.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-m", "s3batch.health"]

# Exec form: the worker is PID 1 and receives SIGTERM directly. It installs its own SIGTERM/SIGINT
# handlers (the kernel ignores signals without a handler for PID 1); with S3BATCH_WORKER_PROCESSES above
# 1 (the default on a container of several cores) it supervises its worker processes, forwarding SIGTERM
# and reaping them itself (docs/how-to/deploy.md section 10), so no init such as tini is needed.
ENTRYPOINT ["s3batch-worker"]
