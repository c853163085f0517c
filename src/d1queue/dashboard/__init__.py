"""The dashboard served by the Worker at /ui (issue 13): pages, sign-in
sessions and CSRF (session.py), its queries (store.py), its script and
stylesheet (assets.py). entry.py hands it every /ui request."""

from .app import Dashboard, Reply

__all__ = ["Dashboard", "Reply"]
