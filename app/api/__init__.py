"""REST API routers under ``/api/v1``."""
