"""Kelvin's built-in web console: static files served by the query API at ``/``.

:func:`mount` adds the page, its static files and two read-only same-origin
proxies (``/console/api/allocator/...``, ``/console/api/agent/...``) so the
browser reaches the allocator's hall and the collect agent's ingest
statistics without CORS. Everything the page loads is in ``static/``.
"""

from services.query_api.console.mount import mount

__all__ = ["mount"]
