"""Domain logic. Keyword-only functions that take the session, raise ``AppError``s, may
``flush()``, and never commit or open a session of their own."""
