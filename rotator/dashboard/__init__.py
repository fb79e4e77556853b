"""The web dashboard and Prometheus metrics (the ``dashboard`` extra: starlette, uvicorn,
prometheus-client, jinja2).

- :mod:`rotator.dashboard.snapshot` reads what the pages show (every queue and topic, one
  queue's detail) and turns it into JSON; rates come from two readings. No web framework.
- :mod:`rotator.dashboard.hub` is the one poll loop that every open page shares: it reads the
  server about once a second while a page listens, and hands each page the latest reading.
- :mod:`rotator.dashboard.metrics` is a prometheus_client collector that reads the queues at
  scrape time (usable in any process's registry, without the web app).
- :mod:`rotator.dashboard.security` decides whether an action may run: the token, the origin.
- :mod:`rotator.dashboard.app` is the Starlette app (pages, server-sent events, actions,
  ``/metrics``, ``/healthz``) and :func:`rotator.dashboard.app.serve` runs it on uvicorn.

Nothing is imported here (the command's defaults only), so ``rotator.dashboard.metrics``
loads without Starlette, and importing :mod:`rotator` never loads any of it.
"""

from __future__ import annotations

# Where `rotator dashboard` listens: loopback, so only this machine can reach it.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
