"""The ``gpuroster`` CLI for lab members: sign in once, then reserve, list, release and run
jobs on reserved GPUs over the service's HTTP API (see ``docs/cli.md``).

Imports only the standard library, typer and httpx (through :mod:`agent.httpx_lean`, which keeps
httpx from importing its own CLI), so the commands start fast on GPU hosts.
"""
