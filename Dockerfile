# Kelvin's container image: one image for every service. Each container runs one
# service in one process: `kelvin run pusher|collect-agent|query-api|allocator`.
#
#   docker build -t kelvin:0.1.0 .                       # build context = repository root
#   docker run --rm -p 8080:8080 kelvin:0.1.0 run query-api --config /etc/kelvin/kelvin.yaml
#   docker build --target dev -t kelvin:dev .            # Tilt's image (see Tiltfile)
#
# Plain Dockerfile syntax only (no BuildKit heredocs, no `# syntax=` frontend to pull),
# so every target also builds offline with podman/buildah, e.g. from a local Debian base:
#   scripts/image-base.sh && podman build --runtime runc \
#     --build-arg PYTHON_IMAGE=localhost/kelvin-base:bookworm -t kelvin:0.1.0 .
#
# The image runs as uid/gid 10001 and works with a read-only root filesystem: the
# only writable paths are volumes the chart mounts (/tmp, the spool, the
# allocator and pusher state under /var/lib/kelvin).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------- build: a venv in /opt/kelvin
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
# A C compiler and Python's headers for Kelvin's compiled core (setup.py; only this stage
# has them: the runtime stage gets the built module in the venv). Debian's python3 keeps
# its headers in python3-dev; the python image has them already.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev \
    && { python3 -c "import os, sys, sysconfig; sys.exit(not os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))" \
         || DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-dev; } \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/kelvin
WORKDIR /src
# Dependencies first, from pyproject.toml alone, so a source change reuses this layer.
COPY pyproject.toml README.md setup.py ./
RUN mkdir services && touch services/__init__.py \
    && /opt/kelvin/bin/pip install ".[plugins]" \
    && /opt/kelvin/bin/pip uninstall --yes kelvin
COPY services ./services
# A regular (not editable) install: the package lands in site-packages, with its data files
# and the compiled core, which must have been built (the image runs the fast paths).
RUN /opt/kelvin/bin/pip install --no-deps . \
    && (cd / && /opt/kelvin/bin/python -c "from services.common import native; assert native.module(), native.describe()") \
    && /opt/kelvin/bin/python -m compileall -q /opt/kelvin/lib

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="kelvin" \
      org.opencontainers.image.description="Holistic HPC data-center monitoring (DCDB-compatible) and thermal-aware job placement" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/kelvin-hpc/kelvin" \
      org.opencontainers.image.url="https://github.com/kelvin-hpc/kelvin" \
      org.opencontainers.image.documentation="https://github.com/kelvin-hpc/kelvin/blob/main/docs/kubernetes.md" \
      org.opencontainers.image.vendor="Kelvin maintainers" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
# ipmitool: the ipmi plugin's default backend (the local BMC through /dev/ipmi0, which the
# pod gets from a device plugin or as a privileged container: docs/kubernetes.md).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ipmitool \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log
RUN groupadd --system --gid 10001 kelvin \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/kelvin --no-create-home \
       --shell /usr/sbin/nologin kelvin \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/kelvin /var/lib/kelvin/spool \
       /var/lib/kelvin/allocator /var/lib/kelvin/pusher \
    && install -d -m 0755 /etc/kelvin
COPY --from=build /opt/kelvin /opt/kelvin
# Where the package lives; the dev stage and the Tiltfile's live_update sync use it.
ENV KELVIN_PACKAGE_DIR=/opt/kelvin/lib/python3.11/site-packages/services
# Bytecode is compiled at build time; caches go to /tmp (an emptyDir in the chart)
# because the root filesystem is read-only.
ENV PATH=/opt/kelvin/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    MPLCONFIGDIR=/tmp/matplotlib
WORKDIR /var/lib/kelvin
USER 10001:10001
# query API, collect agent (HTTP, MQTT), pusher, allocator
EXPOSE 8080 8081 1883 8082 8083
ENTRYPOINT ["kelvin"]
CMD ["--help"]

# ---------------------------------------------------------------- dev: for `tilt up`
# The package is writable by the runtime user (Tilt syncs changed sources into it)
# and `kelvin-dev` restarts the service when a Python file changes.
FROM runtime AS dev
USER root
RUN chown -R 10001:10001 "${KELVIN_PACKAGE_DIR}"
COPY docker/kelvin-dev /usr/local/bin/kelvin-dev
RUN chmod 0755 /usr/local/bin/kelvin-dev
USER 10001:10001
ENTRYPOINT ["kelvin-dev"]

# ---------------------------------------------------------------- release (the default target)
FROM runtime AS release
