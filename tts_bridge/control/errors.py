"""The one refusal every action raises: a code (the bridge API's error codes) and a reason."""

from __future__ import annotations


class ControlError(Exception):
    """An action refused; `code` is the error code the doors answer with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
