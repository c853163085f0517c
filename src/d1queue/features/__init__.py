"""What runs on top of the store, kept apart from it as Oban keeps its
plugins apart from its engine: the drain (drain.py), the cron run (cron.py),
wake-ups through Cloudflare Queues (wake.py) and the built-in
`http.request` job (http_request.py)."""
