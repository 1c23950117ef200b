"""Compare the SASS of every kernel build at two versions: proof that a refactor left the code alone.

    python tools/sass_diff.py --base 5a88854 [--head COMMIT] [--arch sm_90a sm_89 sm_80] [--jobs N]
                              [--keep DIR] [--cache-dir DIR]

Each side (the base commit; the working tree, or --head) is checked out with ``git worktree add
--detach`` in a temporary folder (the working tree is used where it is) and built through the public
CLI only, ``python -m cudattn export --arch ARCH --out DIR``, run in that checkout with
``PYTHONPATH`` on it and a private ``CUDATTN_CACHE_DIR`` (neither side reads the other's kernels;
--cache-dir keeps a commit's for later runs), so that the script depends on no private module of
either version. Every ``DIR/<arch>/*.cubin`` is disassembled with ``cuobjdump -sass`` (from the
CUDA pip wheels, found through cuda.pathfinder) and compared with the other side's cubin of the
same file name, function by function: the instructions and their encodings, and each function's
resource usage (``-res-usage``: registers, stack, shared and constant memory); what cuobjdump
prints around them (``code for``, ``.target``, file names of a fatbin) is dropped. The cubins
themselves are not compared byte for byte: they are built with -lineinfo, whose line tables
change whenever code moves between files. No GPU is needed.

Prints one line per arch (builds identical, builds that differ, builds only one side has) and a
short unified diff of the first difference; exits 0 when every build of every arch is identical,
1 when one differs or the sets of builds differ, 2 when a side could not be built.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_ARCHS = ("sm_90a", "sm_89", "sm_80")
DIFF_LINES = 40  # lines of the first difference shown

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/")  # /*0040*/  OPCODE ... ;  /* 0x... */
_ENCODING = re.compile(r"^\s*/\* 0x[0-9a-f]+ \*/\s*$")  # the second half of an instruction's encoding
_RESOURCE_FUNCTION = re.compile(r"^\s*Function\s+(\S+?):\s*$")


class SideError(RuntimeError):
    """A side could not be checked out, built or disassembled."""


def git(repo: Path, *args: str) -> str:
    res = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise SideError(f"git {' '.join(args)}: {res.stderr.strip()}")
    return res.stdout.strip()


def find_cuobjdump(explicit: str | None) -> str:
    """cuobjdump: --cuobjdump, else the CUDA pip wheels' (cuda.pathfinder), else one on PATH."""
    if explicit:
        return explicit
    try:
        from cuda import pathfinder

        found = pathfinder.find_nvidia_binary_utility("cuobjdump")
        if found:
            return str(found)
    except Exception:  # no cuda-pathfinder, or an older one without binary utilities
        pass
    try:
        import nvidia

        for root in nvidia.__path__:
            for cand in sorted(Path(root).glob("*/bin/cuobjdump")):
                return str(cand)
    except ImportError:
        pass
    on_path = shutil.which("cuobjdump")
    if on_path:
        return on_path
    raise SideError("no cuobjdump: pip install nvidia-cuda-cuobjdump, or pass --cuobjdump PATH")


def export(src: Path, out: Path, cache: Path, archs: list[str], jobs: int, python: str, label: str) -> None:
    """Every build of `src` for `archs` into out/<arch>/*.cubin, through `python -m cudattn export`."""
    env = dict(os.environ, PYTHONPATH=str(src), CUDATTN_CACHE_DIR=str(cache))
    # `python -m` puts the current directory first on sys.path: run inside the checkout, and check
    # that its packages (not an installed or editable copy) are the ones imported.
    probe = subprocess.run([python, "-c", "import cudattn, cu_src; print(cudattn.__file__); print(cu_src.__file__)"],
                           cwd=src, env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        raise SideError(f"{label}: cannot import cudattn: {probe.stderr.strip()[-2000:]}")
    for path in probe.stdout.split():
        if not Path(path).resolve().is_relative_to(src.resolve()):
            raise SideError(f"{label}: imports {path}, not the checkout {src} (an installed copy shadows it)")
    cmd = [python, "-m", "cudattn", "export", "--out", str(out), "--jobs", str(jobs)]
    for arch in archs:
        cmd += ["--arch", arch]
    print(f"{label}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    res = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SideError(f"{label}: export failed ({res.returncode}):\n{(res.stdout + res.stderr)[-4000:]}")
    for line in res.stdout.splitlines():
        if re.match(r"^sm_\w+: \d+ cubins", line):
            print(f"{label}: {line}", file=sys.stderr, flush=True)


def parse_sass(sass: str, resources: str) -> dict[str, str]:
    """Function name -> its code: the instruction and encoding lines under its ``Function :``
    header, after its resource usage line. Everything else cuobjdump prints is not code."""
    usage = {}
    name = None
    for line in resources.splitlines():
        m = _RESOURCE_FUNCTION.match(line)
        if m:
            name = m.group(1)
        elif name is not None and line.strip():
            usage[name] = line.strip()
            name = None
    funcs: dict[str, list[str]] = {}
    cur = None
    for line in sass.splitlines():
        m = _FUNCTION.match(line)
        if m:
            key, n = m.group(1), 2
            while key in funcs:  # the same name twice (a fatbin of several ELFs): keep both
                key, n = f"{m.group(1)}#{n}", n + 1
            cur = funcs[key] = [f"// resources: {usage.get(m.group(1), '?')}"]
        elif cur is not None and (_INSTRUCTION.match(line) or _ENCODING.match(line)):
            cur.append(line.rstrip())
    return {k: "\n".join(v) + "\n" for k, v in funcs.items()}


def disassemble(cuobjdump: str, cubin: Path) -> dict[str, str]:
    outs = []
    for flag in ("-sass", "-res-usage"):
        res = subprocess.run([cuobjdump, flag, str(cubin)], capture_output=True, text=True)
        if res.returncode != 0:
            raise SideError(f"cuobjdump {flag} {cubin}: {res.stderr.strip()}")
        outs.append(res.stdout)
    funcs = parse_sass(*outs)
    if not funcs:
        raise SideError(f"cuobjdump -sass {cubin}: no function found")
    return funcs


def as_text(funcs: dict[str, str]) -> str:
    return "".join(f"Function : {k}\n{v}" for k, v in sorted(funcs.items()))


def first_difference(name: str, base: dict[str, str], head: dict[str, str], limit: int) -> list[str]:
    """A unified diff of the first function (by name) that differs or that one side lacks."""
    for fn in sorted(set(base) | set(head)):
        a, b = base.get(fn, ""), head.get(fn, "")
        if a != b:
            diff = list(difflib.unified_diff(a.splitlines(), b.splitlines(), f"base/{name}:{fn}", f"head/{name}:{fn}",
                                             n=2, lineterm=""))
            more = len(diff) - limit
            return diff[:limit] + ([f"... ({more} more diff lines)"] if more > 0 else [])
    return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare against")
    ap.add_argument("--head", help="a commit to compare (default: the working tree)")
    ap.add_argument("--arch", nargs="+", default=list(DEFAULT_ARCHS), help="compile targets (default: %(default)s)")
    ap.add_argument("--jobs", type=int, default=2, help="compile and disassembly processes (default: %(default)s)")
    ap.add_argument("--cache-dir", type=Path, help="keep each commit's kernel cache in CACHE_DIR/<commit> for later "
                    "runs (a commit's builds never change); the working tree always gets a fresh one")
    ap.add_argument("--keep", type=Path, help="keep the compared SASS in KEEP/{base,head}/<arch>/<build>.sass")
    ap.add_argument("--repo", type=Path, default=Path.cwd(), help="the git repository (default: the current one)")
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs the CLI (default: this one)")
    ap.add_argument("--cuobjdump", help="cuobjdump to use (default: the CUDA pip wheels', else PATH)")
    args = ap.parse_args(argv)

    try:
        repo = Path(git(args.repo, "rev-parse", "--show-toplevel"))
        cuobjdump = find_cuobjdump(args.cuobjdump)
        sides = [("base", git(repo, "rev-parse", "--verify", f"{args.base}^{{commit}}"))]
        sides.append(("head", git(repo, "rev-parse", "--verify", f"{args.head}^{{commit}}") if args.head else None))
    except SideError as e:
        print(f"sass_diff: {e}", file=sys.stderr)
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="sass_diff."))
    worktrees = []
    sass: dict[str, dict[str, dict[str, dict[str, str]]]] = {}  # side -> arch -> build -> function -> code
    try:
        for side, commit in sides:
            if commit is None:
                src, label = repo, "head (working tree)"
            else:
                src, label = tmp / f"{side}-src", f"{side} ({commit[:10]})"
                git(repo, "worktree", "add", "--detach", "--quiet", str(src), commit)
                worktrees.append(src)
            if commit is not None and args.cache_dir is not None:
                cache = args.cache_dir.resolve() / commit
                cache.mkdir(mode=0o700, parents=True, exist_ok=True)
            else:
                cache = tmp / f"{side}-cache"
                cache.mkdir(mode=0o700)
            out = tmp / f"{side}-out"
            export(src, out, cache, args.arch, args.jobs, args.python, label)
            sass[side] = {}
            for arch in args.arch:
                cubins = sorted((out / arch).glob("*.cubin"))
                with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
                    dumps = pool.map(lambda c: disassemble(cuobjdump, c), cubins)
                    sass[side][arch] = dict(zip((c.name for c in cubins), dumps))
                if args.keep:
                    folder = args.keep / side / arch
                    folder.mkdir(parents=True, exist_ok=True)
                    for name, funcs in sass[side][arch].items():
                        (folder / (name.removesuffix(".cubin") + ".sass")).write_text(as_text(funcs))
    except SideError as e:
        print(f"sass_diff: {e}", file=sys.stderr)
        return 2
    finally:
        for src in worktrees:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(src)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    ok = True
    for arch in args.arch:
        base, head = sass["base"][arch], sass["head"][arch]
        common = sorted(set(base) & set(head))
        differ = [n for n in common if base[n] != head[n]]
        only_base, only_head = sorted(set(base) - set(head)), sorted(set(head) - set(base))
        line = f"{arch}: {len(common) - len(differ)} builds identical, {len(differ)} differ"
        if differ:
            line += ": " + ", ".join(differ)
        if only_base:
            line += f"; only at base ({len(only_base)}): " + ", ".join(only_base)
        if only_head:
            line += f"; only at head ({len(only_head)}): " + ", ".join(only_head)
        if not common and not only_base and not only_head:
            line += " (no builds at all)"
        print(line)
        if differ:
            for d in first_difference(differ[0], base[differ[0]], head[differ[0]], DIFF_LINES):
                print("    " + d)
        ok = ok and not differ and not only_base and not only_head and bool(common)
    if args.keep:
        print(f"SASS kept in {args.keep}/base and {args.keep}/head")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
