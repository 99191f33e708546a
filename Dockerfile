# Nibble's images: one multi-stage Dockerfile, one target per service over a shared runtime.
#
#   docker build --target weightsync -t nibble-weightsync .          # also: trainer, sampler, runtime
#   docker build --build-arg ACCELERATOR=cuda --target trainer -t nibble-trainer:cuda .
#
# Build arguments
#   BASE_IMAGE   a Debian/Ubuntu image with python3 (>= 3.10) and its venv module; the default comes from
#                Docker Hub. Where no registry is reachable, build a local one from Debian packages
#                (scripts/build-images does, with mmdebstrap) and pass its name.
#   ACCELERATOR  cpu (default) or cuda: which torch build the runtime carries (the CPU or the CUDA
#                base of every service). CUDA torch wheels bring their own CUDA libraries (and triton),
#                so the CUDA image needs only the host's driver (NVIDIA container toolkit), not a CUDA
#                base image.
#   TORCH_VERSION, TORCH_INDEX_CPU, TORCH_INDEX_CUDA   where torch comes from.
#   PIP_NO_INDEX, PIP_FIND_LINKS   pip's own settings, for a build from a local wheelhouse (offline).
#
# The images run as the unprivileged user nibble (uid 10001) with a read-only root filesystem: every
# path Nibble writes (runs/, caches, /tmp) is under /tmp or /data, which compose and the Helm chart
# mount as volumes.

ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm
ARG ACCELERATOR=cpu

# -- base: the interpreter in a virtual environment, the user, the writable paths --------------------
FROM ${BASE_IMAGE} AS base
ENV VIRTUAL_ENV=/opt/nibble \
    PATH=/opt/nibble/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/nibble \
    XDG_CACHE_HOME=/tmp/cache \
    MPLCONFIGDIR=/tmp/cache/matplotlib \
    TRITON_CACHE_DIR=/tmp/cache/triton \
    TORCHINDUCTOR_CACHE_DIR=/tmp/cache/inductor
# python:*-slim keeps python in /usr/local; Debian's own python3 is in /usr/bin: use whichever is there.
RUN python3 -m venv "$VIRTUAL_ENV" \
 && groupadd --system --gid 10001 nibble \
 && useradd --system --uid 10001 --gid nibble --home-dir /home/nibble --create-home --shell /usr/sbin/nologin nibble \
 && install -d -o nibble -g nibble -m 0750 /data /data/weights /models
WORKDIR /data

# -- wheel: the project built as a wheel (the package-dir mapping is proven outside the source tree) --
FROM base AS wheel
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
WORKDIR /src
COPY pyproject.toml README.md ./
COPY nibble ./nibble
COPY kernels ./kernels
COPY services ./services
RUN pip wheel --no-deps --wheel-dir /dist . && rm -rf /src/build

# -- runtime: torch (CPU or CUDA build) + the Nibble wheel and its dependencies; every service's base ---
FROM base AS runtime
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
ARG ACCELERATOR
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_CPU=https://download.pytorch.org/whl/cpu
ARG TORCH_INDEX_CUDA=https://download.pytorch.org/whl/cu128
# torch first, in a layer of its own that a change of Nibble's source does not rebuild.
RUN case "$ACCELERATOR" in \
      cpu) index="$TORCH_INDEX_CPU" ;; \
      cuda) index="$TORCH_INDEX_CUDA" ;; \
      *) echo "ACCELERATOR must be cpu or cuda, got '$ACCELERATOR'" >&2; exit 2 ;; \
    esac \
 && pip install --index-url "$index" "torch==$TORCH_VERSION"
RUN --mount=type=bind,from=wheel,source=/dist,target=/dist \
    pip install /dist/nibble-*.whl \
 && nibble --help >/dev/null
# Read by the NVIDIA container runtime only (which exposes the GPUs to CUDA builds); inert elsewhere.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
ENTRYPOINT ["nibble"]
CMD ["--help"]

# -- one target per service: its command, ports and a gRPC health check --------------------------------
# Each service reads /etc/nibble/config.yaml (mount one; NIBBLE_* variables override its keys) and serves
# gRPC health checking (weight-sync on its fetch port, the others on health_port, which the config must
# set), which `nibble health --config ... --role ...` asks on the port that config names. The shell
# form (CMD-SHELL) because podman 4.3 fails exec-form health checks of images built by buildah.

FROM runtime AS weightsync
EXPOSE 50051 50052 9400
HEALTHCHECK --interval=15s --timeout=10s --start-period=60s --retries=3 \
    CMD nibble health --config /etc/nibble/config.yaml --role weightsync
ENTRYPOINT ["python", "-m", "nibble.weightsync"]
CMD ["--config", "/etc/nibble/config.yaml"]

FROM runtime AS trainer
EXPOSE 9401 50061
HEALTHCHECK --interval=15s --timeout=10s --start-period=300s --retries=3 \
    CMD nibble health --config /etc/nibble/config.yaml --role trainer
ENTRYPOINT ["python", "-m", "nibble.trainer"]
CMD ["--config", "/etc/nibble/config.yaml", "--out", "/data/out"]

FROM runtime AS sampler
EXPOSE 9402 50062
HEALTHCHECK --interval=15s --timeout=10s --start-period=300s --retries=3 \
    CMD nibble health --config /etc/nibble/config.yaml --role sampler
ENTRYPOINT ["python", "-m", "nibble.sampler"]
CMD ["--config", "/etc/nibble/config.yaml"]
