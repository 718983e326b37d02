"""The loopback hub fixture for the download tests."""

from tests.support.hfhub import hub

__all__ = ["hub"]
