"""d1queue: a durable job queue for Cloudflare Python Workers, in D1.

Importable under plain CPython: nothing here imports the `workers` SDK or
`js`; the driver adapts to whatever D1 binding it is handed.
"""

from .core.config import Config, ConfigError
from .core.context import JobContext
from .core.errors import (
    BatchNotRunning,
    Fail,
    Retry,
    TooManyDependents,
    TooManyEdges,
    UnknownDependency,
)
from .core.job import QueuedJob
from .core.outcomes import Outcome
from .core.registry import Backoff, JobSpec, Registry
from .features.drain import DrainReport, drain
from .store.failed import FailedJob
from .store.push import DuplicateJobId
from .store.queue import D1Queue
from .store.shardset import ShardQueue, ShardSet

__version__ = "0.1.0"

__all__ = [
    "Backoff",
    "BatchNotRunning",
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
    "TooManyDependents",
    "TooManyEdges",
    "UnknownDependency",
    "__version__",
    "drain",
]
