"""gpuroster service: reservations of lab GPUs over SQLAlchemy, a REST API, pages, metrics."""

__version__ = "0.1.0"
