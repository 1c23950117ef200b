#!/usr/bin/env bash
# Record asv results on a GPU machine for one or more commits, with the suite of the current
# checkout and the current python (no per-commit build): each commit's cudattn is checked out
# into a temporary worktree and put first on the benchmarks' path. Results land in
# benchmarks/results/<machine>/ (commit them; `asv publish` then draws the history anywhere).
#
#   tools/asv_record.sh [--machine NAME] COMMIT [COMMIT ...]
#
# NAME defaults to the GPU's name, lower-case and dashed ("nvidia-h200"). Needs asv importable by
# python3 (pip install "cudattn[bench]") and the commits in the local git repository.
set -uo pipefail
cd "$(dirname "$0")/.."
machine=""
if [ "${1:-}" = "--machine" ]; then machine=$2; shift 2; fi
[ $# -ge 1 ] || { echo "usage: $0 [--machine NAME] COMMIT [COMMIT ...]" >&2; exit 2; }
if [ -z "$machine" ]; then
    machine=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')
fi
python3 -m asv machine --yes --machine "$machine" >/dev/null
status=0
for c in "$@"; do
    full=$(git rev-parse --verify "$c^{commit}") || { status=1; continue; }
    wt=$(mktemp -d)/cudattn
    git worktree add -q --detach "$wt" "$full"
    echo "== asv: $machine, commit ${full:0:12} ($(git log -1 --format=%s "$full"))"
    # asv >= 0.6.5 puts ASV_PYTHONPATH on the benchmarks' sys.path; older 0.6.x use PYTHONPATH.
    PYTHONPATH="$wt${PYTHONPATH:+:$PYTHONPATH}" ASV_PYTHONPATH="$wt" \
        python3 -m asv run --python=same --launch-method spawn --machine "$machine" \
        --set-commit-hash "$full" --show-stderr || { echo "asv: failures for ${full:0:12}"; status=1; }
    git worktree remove --force "$wt"
done
exit $status
