"""argparse types the command lines share."""

from __future__ import annotations

import argparse


def at_least(minimum: int, what: str):
    """An argparse type: an int >= ``minimum``, else the message "expected ``what``; got ..."."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}; got {n}")
        return n

    return parse
