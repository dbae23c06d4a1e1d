#!/usr/bin/env bash
# make test-container: the worker image built and run for real on a Docker engine.
#
# 1. an engine (scripts/container/engine.sh: the one running, or Debian's docker.io started here);
# 2. the base image (scripts/container/base-image.sh: Debian 12 from packages, built once and cached),
#    or S3BATCH_BASE_IMAGE when set (e.g. the pinned python slim image where a registry is reachable);
# 3. the worker image from the Dockerfile, `docker build --network host` (the engine runs without a
#    bridge), with this machine's pip index (PIP_INDEX_URL or pip's configured index-url, if any)
#    as a build argument;
# 4. tests/test_container.py against the local test stack (its containers use --network host);
# 5. removes its containers and the worker image, and stops the engine if it started it. The base
#    image and the build cache (the dependencies' layer: 3 GB at most) stay.
# Skipped, with the reason, where no engine can be had (not root, or no apt-get).
# S3BATCH_CONTAINER_CONTEXT: the directory to build the image from (default: this checkout), e.g. a
# `git archive HEAD | tar -x -C DIR` export to build what is committed while the tree is being edited.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
started=$(date +%s)

rc=0
engine=$(scripts/container/engine.sh start) || rc=$?
if [ "$rc" = 3 ]; then
    echo "container test skipped: no Docker engine (see above); it needs root and apt-get, or a running engine"
    exit 0
fi
[ "$rc" = 0 ] || exit "$rc"
export "${engine?}"
echo "engine: $DOCKER_HOST ($(docker version --format '{{.Server.Version}}'))"

RUN_ID=$$-$(date +%s)
IMAGE=s3batch-worker:test-$RUN_ID
cleanup() {
    local ids
    ids=$(docker ps -aq --filter "label=s3batch.test=$RUN_ID" 2>/dev/null || true)
    [ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1 || true
    docker rmi -f "$IMAGE" >/dev/null 2>&1 || true
    docker image prune -f >/dev/null 2>&1 || true
    # The build cache stays, up to 3 GB (least recently used first out): the next build reuses the layer of
    # the locked dependencies (its pip install: 28 s alone, 117 s beside the suite) until requirements.lock
    # or pyproject.toml changes.
    builder builder prune -af --keep-storage 3GB >/dev/null 2>&1 || true
    scripts/container/engine.sh stop || true
}
trap cleanup EXIT

# The client for `docker build`: BuildKit (far fewer layer copies than the legacy builder on vfs)
# through buildx when installed, else through the docker.io package's own client, which has it built
# in; the legacy builder otherwise.
builder() {
    local debian_client
    debian_client=$(dpkg -L docker.io 2>/dev/null | grep '/bin/docker$' | head -n 1 || true)
    if docker buildx version >/dev/null 2>&1; then
        DOCKER_BUILDKIT=1 docker "$@"
    elif [ -n "$debian_client" ] && [ -x "$debian_client" ]; then
        DOCKER_BUILDKIT=1 "$debian_client" "$@"
    else
        DOCKER_BUILDKIT=0 docker "$@"
    fi
}

t=$(date +%s)
if [ -n "${S3BATCH_BASE_IMAGE:-}" ]; then
    BASE=$S3BATCH_BASE_IMAGE
else
    rc=0
    BASE=$(scripts/container/base-image.sh) || rc=$?
    if [ "$rc" = 3 ]; then
        echo "container test skipped: no base image (see above); set S3BATCH_BASE_IMAGE to one the engine has"
        exit 0
    fi
    [ "$rc" = 0 ] || exit "$rc"
fi
echo "base image: $BASE ($(( $(date +%s) - t )) s)"

build_args=(--build-arg "BASE_IMAGE=$BASE")
index=${PIP_INDEX_URL:-$("$PYTHON" -m pip config get global.index-url 2>/dev/null || true)}
case "$index" in
    http://* | https://*) build_args+=(--build-arg "PIP_INDEX_URL=$index") ;;
esac

t=$(date +%s)
log=$(mktemp)
context=${S3BATCH_CONTAINER_CONTEXT:-.}
if ! builder build --network host --progress plain "${build_args[@]}" -t "$IMAGE" "$context" >"$log" 2>&1; then
    tail -n 40 "$log"
    rm -f "$log"
    echo "worker image build failed"
    exit 1
fi
rm -f "$log"
build_seconds=$(( $(date +%s) - t ))
size=$(docker image inspect --format '{{.Size}}' "$IMAGE")
layers=$(docker image inspect --format '{{len .RootFS.Layers}}' "$IMAGE")
echo "worker image: $IMAGE built in $build_seconds s, $(( size / 1000000 )) MB, $layers layers"

S3BATCH_CONTAINER_IMAGE=$IMAGE S3BATCH_CONTAINER_LABEL=$RUN_ID S3BATCH_CONTAINER_CONTEXT=$(cd "$context" && pwd) \
    "$PYTHON" -m pytest -p no:cacheprovider -q -s tests/test_container.py "$@"
echo "make test-container: $(( $(date +%s) - started )) s in all"
