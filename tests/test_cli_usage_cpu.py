"""Misuse of the command line names what was wrong, in one line, from the (sub)command that met it:
an unknown option is named before any missing argument, and the pointer is that subcommand's
`--help`. Exit status 2, nothing on stdout."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = [
    (["--bogus"], "", "unrecognized option --bogus"),
    (["--bogus=3", "info"], "", "unrecognized option --bogus"),
    (["export", "--bogus"], " export", "unrecognized option --bogus"),
    (["export", "--out", "x", "--bogus"], " export", "unrecognized option --bogus"),
    (["export", "--arch", "sm_75", "--out", "x"], " export", "argument --arch: unknown compile target 'sm_75'"),
    (["export"], " export", "the following arguments are required: --out"),
    (["cache", "clear", "--bogus"], " cache", "unrecognized option --bogus"),
    (["cache", "info", "--arch", "sm_7"], " cache", "argument --arch: unknown compile target 'sm_7'"),
    (["cache", "warm", "--jobs", "x"], " cache", "argument --jobs: expected a positive integer"),
    (["info", "extra"], " info", "unexpected argument 'extra'"),
    (["demo", "--bogus"], " demo", "unrecognized option --bogus"),
    (["bench", "--bogus"], " bench", "unrecognized option --bogus"),
    (["selfcheck", "--bogus"], " selfcheck", "unrecognized option --bogus"),
]


@pytest.mark.parametrize("argv,sub,message", CASES, ids=lambda a: " ".join(a) if isinstance(a, list) else None)
def test_misuse_names_the_problem_and_the_subcommand_help(argv, sub, message):
    res = subprocess.run([sys.executable, "-m", "cudattn", *argv], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stdout == "", res
    (line,) = res.stderr.splitlines()
    prog = f"python -m cudattn{sub}"
    assert line.startswith(f"{prog}: error: {message}"), line
    assert line.endswith(f"(see {prog} --help)"), line


def test_help_still_works_and_shows_the_c_build():
    res = subprocess.run([sys.executable, "-m", "cudattn", "export", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "--print-cflags" in res.stdout and "-ldl" in res.stdout
    res = subprocess.run([sys.executable, "-m", "cudattn", "cache", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "only the entries of this target" in " ".join(res.stdout.split())
