"""d1queue: a durable job queue for Cloudflare Python Workers, in D1.

Importable under plain CPython: nothing here imports the `workers` SDK or
`js`; the driver adapts to whatever D1 binding it is handed.
"""

from .config import Config, ConfigError
from .context import JobContext
from .errors import Fail, Retry
from .job import QueuedJob
from .queue import D1Queue, DuplicateJobId, FailedJob, Outcome
from .registry import Backoff, JobSpec, Registry
from .shardset import ShardQueue, ShardSet
from .worker import DrainReport, drain

__version__ = "0.1.0"

__all__ = [
    "Backoff",
    "Config",
    "ConfigError",
    "D1Queue",
    "DrainReport",
    "DuplicateJobId",
    "Fail",
    "FailedJob",
    "JobContext",
    "JobSpec",
    "Outcome",
    "QueuedJob",
    "Registry",
    "Retry",
    "ShardQueue",
    "ShardSet",
    "__version__",
    "drain",
]
