"""The repository's address in the manual, from pyproject.toml's [project.urls] Source (the one
place it is written): the site's repository link, and `{repository}` in the pages' text."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
TOKEN = "{repository}"


def _source() -> str:
    with PYPROJECT.open("rb") as file:
        return str(tomllib.load(file)["project"]["urls"]["Source"]).rstrip("/")


def on_config(config: Any) -> Any:
    config["repo_url"] = _source()
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return markdown.replace(TOKEN, str(config["repo_url"]))
