"""npuctl's argument types: each turns a command-line word into a value or says
why it cannot (argparse prints the message as a usage error, exit status 64)."""

from __future__ import annotations

import argparse

from npu_client._model_run import parse_assignment, parse_constant, parse_dims


def assignment(text: str) -> tuple[str, str]:
    try:
        return parse_assignment(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def constant(text: str) -> tuple[str, int | float | tuple[int | float, ...]]:
    try:
        name, values = parse_assignment(text)
        return name, parse_constant(values)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def shape(text: str) -> tuple[str, tuple[int | tuple[int, ...], ...]]:
    try:
        name, dims = parse_assignment(text)
        return name, parse_dims(dims)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def socket_path(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("the socket path is empty")
    return text


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds: {text!r}")
    return value


def dsp_result(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 0xFFFF_FFFF:
        raise argparse.ArgumentTypeError(f"a DSP result is a non-zero u32: {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text!r}")
    return value
