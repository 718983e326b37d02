"""Argument parsing shared by the commands: each subcommand has a description and shows defaults."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except the empty ones ("default: None" says nothing)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, argparse.SUPPRESS) or not action.help:
            return action.help
        if isinstance(action.default, list) and not action.default:
            return action.help
        return super()._get_help_string(action)


def add_command(
    sub: Any, name: str, summary: str, description: str, parents: Sequence[argparse.ArgumentParser]
) -> argparse.ArgumentParser:
    """A subcommand with a one-line summary (in the parent's list) and its own description."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        parents=list(parents),
        help=summary,
        description=description,
        formatter_class=HelpFormatter,
    )
    return parser
