"""Give every recorded asv result of a machine one environment name, so each graph is one line.

`asv run --python=same` names the environment after the interpreter's path, which differs between
machines of one GPU kind and between images; the dashboard then draws one line per path. This
rewrites the results of `benchmarks/results/<machine>/` to the environment `ENV` with the Python
version as its only parameter (`params.python`, given: the path of an `existing` environment does
not say it), and renames the files to match (`<commit8>-<ENV>.json`), keeping the newest run
where two files name one commit (by when its benchmarks started: asv's ``date`` is the commit's).

    python tools/asv_normalize.py MACHINE [--env NAME] [--python X.Y] [--adopt-versions]

--adopt-versions also files every result under its benchmark's version in
`benchmarks/results/benchmarks.json` (the current suite's): for results recorded before the suite
stated its versions (asv hides results of other versions), where what the benchmark measures has
not changed since.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def normalize(machine: str, env: str, version: str, adopt: bool = False) -> list[Path]:
    folder = RESULTS / machine
    current = {}
    if adopt:
        current = {k: v["version"] for k, v in json.loads((RESULTS / "benchmarks.json").read_text()).items()
                   if isinstance(v, dict) and "version" in v}
    if not folder.is_dir():
        raise SystemExit(f"no results for machine {machine!r} in {folder}")
    machine_json = folder / "machine.json"
    if machine_json.exists():
        info = json.loads(machine_json.read_text())
        info["machine"] = machine
        machine_json.write_text(json.dumps(info, indent=4) + "\n")
    kept: dict[str, tuple[int, Path, dict]] = {}
    for path in sorted(folder.glob("*.json")):
        if path.name == "machine.json":
            continue
        data = json.loads(path.read_text())
        data["env_name"] = env
        data["python"] = version
        data["params"] = {"machine": machine, "python": version}
        if current:
            col = data["result_columns"].index("version")
            for name, row in data["results"].items():
                if name in current:
                    row[col] = current[name]
        commit = data["commit_hash"]
        col = data["result_columns"].index("started_at") if "started_at" in data["result_columns"] else None
        date = max(((row[col] if len(row) > col else 0) or 0 for row in data["results"].values()), default=0) \
            if col is not None else 0
        if commit in kept and kept[commit][0] > date:
            path.unlink()
            continue
        if commit in kept:
            kept[commit][1].unlink()
        kept[commit] = (date, path, data)
    written = []
    for commit, (_, path, data) in kept.items():
        target = folder / f"{commit[:8]}-{env}.json"
        text = json.dumps(data, indent=None, separators=(",", ":"), sort_keys=True)
        if path != target and path.exists():
            path.unlink()
        target.write_text(text + "\n")
        written.append(target)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("machine")
    ap.add_argument("--env", default="gpu")
    ap.add_argument("--python", default="{}.{}".format(*sys.version_info[:2]), help="default: this interpreter's")
    ap.add_argument("--adopt-versions", action="store_true", help="file results under the current suite's versions")
    args = ap.parse_args()
    for path in normalize(args.machine, args.env, args.python, args.adopt_versions):
        print(path.relative_to(RESULTS.parent.parent))


if __name__ == "__main__":
    main()
