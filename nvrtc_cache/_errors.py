"""The one exception type this package raises for NVRTC failures."""

from __future__ import annotations


class CompileError(Exception):
    """NVRTC refused a program (or an NVRTC call failed).

    Carries everything needed to reproduce the failure without re-running it:
    the NVRTC result name, the full log, the exact option list passed to NVRTC,
    and the source name.
    """

    def __init__(self, result: str, *, log: str, options: list[str], name: str) -> None:
        self.result = result
        self.log = log
        self.options = list(options)
        self.name = name
        super().__init__(result, log, self.options, name)

    def __str__(self) -> str:
        log = self.log.rstrip() or "(empty log)"
        return (
            f"NVRTC failed to compile {self.name!r}: {self.result}\n"
            f"options: {' '.join(self.options)}\n"
            f"--- NVRTC log ---\n{log}"
        )
