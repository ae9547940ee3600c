"""Pydantic request/response schemas of the REST API, apart from the ORM models."""
