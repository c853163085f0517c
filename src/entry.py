"""d1queue's Worker: the library's Worker glue (d1queue.interfaces.cloudflare)
over this deployment's jobs. Every handler and RPC method is the glue's;
the HTTP API and the dashboard are at the root (/health, /v1/..., /ui)."""

from d1queue.interfaces.cloudflare import d1queue_entrypoint
from jobs import registry


class Default(d1queue_entrypoint(registry)):  # type: ignore[misc]
    """fetch (the HTTP API, the dashboard), scheduled (the cron), queue
    (wake-ups) and the RPC methods of D1QueueEntrypoint."""
