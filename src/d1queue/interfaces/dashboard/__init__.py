"""The dashboard served by the Worker at /ui: its routes and request handling
(app.py), sign-in, sessions and CSRF (auth.py, session.py; the read-only
token's sessions too), its pages and their actions (pages.py), what each
page shows (queues.py, jobs.py, failed.py, schedules.py, limits.py,
chart.py, metrics.py, search.py, built of parts.py's parts; charts drawn
by svg.py),
secrets masked in payloads (mask.py), its script and stylesheet
(assets.py); its queries are the store's (store/dashboard.py).
The Worker glue (interfaces/cloudflare.py) hands it every request under
<prefix>/ui."""

from ..router import Reply
from .app import Dashboard, is_dashboard_path

__all__ = ["Dashboard", "Reply", "is_dashboard_path"]
