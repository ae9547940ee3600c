"""``pydantic_settings`` without loading ``asyncio`` until something uses it.

``pydantic_settings/main.py`` runs ``import asyncio`` at the top, for one use:
``CliApp.run`` of an ``async`` command. The agent never runs one, yet ``asyncio`` (with
``concurrent.futures``, 35 modules) stayed loaded in its process for good: about 1.4 MiB of
traced memory (tracemalloc), most of it code objects. So while ``pydantic_settings`` is
imported, ``sys.modules["asyncio"]`` holds a stand-in module, and the name ``asyncio`` in
``pydantic_settings.main`` keeps pointing at it; the stand-in leaves ``sys.modules`` as soon as
that import is over, so everything else imports the real ``asyncio`` as usual. The first
attribute read from the stand-in (``asyncio.run``) imports the real module and answers from
it. Where ``asyncio`` is already loaded (a test run, the service) nothing is replaced.
Import ``pydantic_settings`` from here::

    from agent.settings_lean import pydantic_settings

It lives next to :mod:`agent.httpx_lean`, which keeps httpx's command-line tool out the
same way.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


def _real_asyncio(name: str) -> Any:
    """Attribute ``name`` of the real ``asyncio``, imported on the first read."""
    if sys.modules.get("asyncio") is _STANDIN:  # read while pydantic_settings was being imported
        del sys.modules["asyncio"]
    return getattr(importlib.import_module("asyncio"), name)


_STANDIN = types.ModuleType("asyncio", "Stands for asyncio until an attribute is read (agent.settings_lean).")
_STANDIN.__getattr__ = _real_asyncio  # type: ignore[method-assign]  # module __getattr__ (PEP 562)

if "asyncio" in sys.modules or "pydantic_settings" in sys.modules:
    import pydantic_settings
else:
    sys.modules["asyncio"] = _STANDIN
    try:
        import pydantic_settings
    finally:
        if sys.modules.get("asyncio") is _STANDIN:
            del sys.modules["asyncio"]

__all__ = ["pydantic_settings"]
