# gpuroster: the service (and the agent, same image). See docker-compose.yml and docs/deploy.md.
# Stage 1 builds the wheel; stage 2 installs it with the [server] extra, as a user would.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . /src
RUN pip wheel --no-deps --wheel-dir /dist /src

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Dependencies first (their layer is reused until pyproject.toml changes): the base (agent)
# dependencies and the [server] extra.
COPY pyproject.toml /tmp/pyproject.toml
RUN python -c "import tomllib; p = tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['server']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt /tmp/pyproject.toml

# The application: the wheel (templates, static files, migrations and alembic.ini inside it).
COPY --from=build /dist /dist
RUN pip install "$(ls /dist/gpuroster-*.whl)[server]" \
    && rm -rf /dist \
    && useradd --system --uid 10001 --home-dir /var/lib/gpuroster --shell /usr/sbin/nologin gpuroster \
    && mkdir -p /var/lib/gpuroster \
    && chown gpuroster /var/lib/gpuroster

ENV GPUROSTER_DATA_DIR=/var/lib/gpuroster
WORKDIR /var/lib/gpuroster
USER gpuroster
EXPOSE 8000

HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=3).status == 200 else 1)"]

# Default: migrate, then serve on all interfaces (Compose overrides this for its replicas).
CMD ["gpuroster", "serve", "--host", "0.0.0.0", "--port", "8000"]
