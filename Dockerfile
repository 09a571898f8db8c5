# The operator image: slim Python, the package's declared runtime dependencies only
# (no compilers, no vLLM, no torch), a non-root user, compatible with a read-only root
# filesystem (the chart mounts an emptyDir at /tmp, the only path it writes).
#   docker build -t vllm-operator:0.1.0 .
# tests/artefacts/test_packaging.py checks what can be checked without a Docker engine: the wheel's
# Requires-Dist equals pyproject's dependencies, the user is non-root, the entrypoint, both
# stages on the same base pinned by digest (a tag moves; a digest is the bytes that were reviewed).
# To move the base: `docker buildx imagetools inspect python:3.11-slim` prints the index digest.
ARG BASE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
FROM ${BASE} AS build
WORKDIR /src
COPY requirements.lock pyproject.toml README.md ./
COPY operator ./operator
# The runtime dependencies exactly as locked, versions and hashes (pip refuses any other file: `make lock`
# regenerates the lock from pyproject.toml), then the package itself without resolving anything again.
# All are published as wheels: nothing compiles.
RUN pip wheel --no-cache-dir --require-hashes --wheel-dir /wheels -r requirements.lock \
    && pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${BASE}
RUN groupadd --gid 65532 operator \
    && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin operator
COPY --from=build /wheels /wheels
# pip compiles the bytecode here, at build time: at run time the root filesystem is read-only.
RUN pip install --no-cache-dir --no-index --no-deps /wheels/*.whl && rm -rf /wheels
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["vllm-operator", "run"]
