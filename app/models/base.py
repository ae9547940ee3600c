"""Declarative base with a constraint naming convention and UTC-aware timestamps."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, MetaData, TypeDecorator
from sqlalchemy.orm import DeclarativeBase

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator):
    """A timezone-aware timestamp stored in UTC on every database.

    Accepts only aware datetimes (raises ``ValueError`` on naive ones) and always returns
    aware UTC datetimes, also from SQLite, which keeps no offset.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def utcnow() -> datetime:
    """The current instant, timezone-aware UTC."""
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON, list[str]: JSON}
    # Every server default here only serves rows written outside the ORM (migrations, SQL):
    # the column also has a Python default, which the ORM always sends. Left at "auto", the
    # ORM asks for such a column back with RETURNING, which makes each INSERT a new statement
    # whose cache key SQLAlchemy computes again: about 1 ms of every booking.
    # tests/app/test_booking_statements.py checks that a model never gets a server default alone.
    __mapper_args__ = {"eager_defaults": False}
