"""The ``gpuroster`` CLI for lab members: sign in once, then reserve, list, release and run
jobs on reserved GPUs over the service's HTTP API (see ``docs/cli.md``).

Imports only the standard library, typer and httpx, so the commands start fast on GPU hosts.
"""
