"""What every ``kvpilot`` subcommand shares: exit codes, the input error, argv types and file reading."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_INFEASIBLE, EXIT_USAGE = 0, 1, 2


class CliError(Exception):
    """A problem with the command's input, reported as one line on stderr (exit 2)."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def read_text(path: str) -> str:
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {file}: {exc}") from None


def read_json(path: str) -> Any:
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise CliError(f"{path} is nested too deeply to read") from None


# -- plan ---------------------------------------------------------------------------------------
