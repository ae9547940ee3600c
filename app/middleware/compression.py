"""Response compression: the settings of the application's ``GZipMiddleware``, and the same
compression for a body an endpoint caches already compressed (a large answer that did not
change since the last request need not be compressed again).

The middleware passes a response that carries ``Content-Encoding`` through untouched, so an
endpoint answering with :func:`gzip_body` sends exactly what the middleware would have
sent, less the work.
"""

from __future__ import annotations

import gzip

from starlette.requests import Request

#: bodies shorter than this (bytes) go out uncompressed
MINIMUM_SIZE = 2048
#: zlib level: the large lists and pages compress to about a tenth at a fraction of level 9's time
LEVEL = 5


def accepts_gzip(request: Request) -> bool:
    """Whether the middleware would compress the answer to ``request`` (its test, verbatim)."""
    return "gzip" in request.headers.get("Accept-Encoding", "")


def gzip_body(body: bytes) -> bytes:
    """``body`` gzip-compressed at :data:`LEVEL` (modification time 0: the same body always
    gives the same bytes, as a cache wants)."""
    return gzip.compress(body, compresslevel=LEVEL, mtime=0)
