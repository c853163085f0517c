"""The dashboard served by the Worker at /ui: pages, sign-in sessions,
sign-outs and CSRF (session.py), its queries (store.py), secrets masked in
payloads (mask.py), its script and stylesheet (assets.py). entry.py hands it
every /ui request."""

from .app import Dashboard, Reply

__all__ = ["Dashboard", "Reply"]
