"""The test kit under its short, documented path; it lives in interfaces.testing."""

from .interfaces.testing import *  # noqa: F403
