# gpuroster: the service (and the agent, same image). See docker-compose.yml and docs/deploy.md.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first (their layer is reused until pyproject.toml changes).
COPY pyproject.toml /app/
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The application. It runs from /app (templates/, static/, migrations/ and alembic.ini are
# read relative to the source tree), hence the editable install.
COPY . /app
RUN pip install --no-deps -e /app \
    && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin gpuroster \
    && mkdir -p /var/lib/gpuroster \
    && chown gpuroster /var/lib/gpuroster

ENV GPUROSTER_DATA_DIR=/var/lib/gpuroster
USER gpuroster
EXPOSE 8000

HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=3).status == 200 else 1)"]

# Default: migrate, then serve on all interfaces (Compose overrides this for its replicas).
CMD ["gpuroster", "serve", "--host", "0.0.0.0", "--port", "8000"]
