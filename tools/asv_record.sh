#!/usr/bin/env bash
# Record asv results on a GPU machine for one or more commits, with the suite of the current
# checkout and the current python (no per-commit build): each commit's cudattn is checked out
# into a temporary worktree and put first on the benchmarks' path, its kernels compiled up front
# where that commit has `cudattn cache warm`. Results land in benchmarks/results/<machine>/ under
# each commit's true hash (never the checkout's), with one environment name (tools/asv_normalize.py),
# so that `asv publish` draws one line per benchmark; commit them.
#
#   tools/asv_record.sh [--machine NAME] [--minutes N] COMMIT [COMMIT ...]
#
# NAME defaults to the GPU kind: "h100", "h200" (else the GPU's name, lower-case and dashed).
# --minutes N: start no commit that would likely end past N minutes from the start (the time of
# the slowest commit so far is the estimate); the commits left are printed, to record next time.
# Needs asv importable by python3 (pip install "cudattn[bench]") and the commits in the local git
# repository (asv reads each commit's date from it); a copy that lacks them can fetch them from a
# bundle made where they are: `git bundle create main.bundle main`, then `git fetch main.bundle main`.
set -uo pipefail
cd "$(dirname "$0")/.."
machine=""
minutes=0
while [ $# -gt 0 ]; do
    case "$1" in
        --machine) machine=${2:?--machine needs a name}; shift 2 ;;
        --minutes) minutes=${2:?--minutes needs a whole number}; shift 2 ;;
        *) break ;;
    esac
done
[ $# -ge 1 ] || { echo "usage: $0 [--machine NAME] [--minutes N] COMMIT [COMMIT ...]" >&2; exit 2; }
[[ $minutes =~ ^[0-9]+$ ]] || { echo "$0: --minutes takes a whole number of minutes, not '$minutes'" >&2; exit 2; }
if [ -z "$machine" ]; then
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    case "$gpu" in
        *H100*) machine=h100 ;;
        *H200*) machine=h200 ;;
        *) machine=$(echo "$gpu" | tr 'A-Z ' 'a-z-') ;;
    esac
fi
pyver=$(python3 -c 'import sys; print("{}.{}".format(*sys.version_info[:2]))')
python3 -m asv machine --yes --machine "$machine" >/dev/null
cache=${CUDATTN_CACHE_DIR:-$(mktemp -d)/kernels}
start=$(date +%s)
slowest=0
status=0
left=()
for c in "$@"; do
    now=$(date +%s)
    if [ "$minutes" -gt 0 ] && [ $((now - start + slowest)) -gt $((minutes * 60)) ]; then
        left+=("$c")
        continue
    fi
    full=$(git rev-parse --verify "$c^{commit}") || { status=1; continue; }
    tmp=$(mktemp -d)
    wt=$tmp/cudattn
    # without its worktree the benchmarks would import another cudattn and file it under this hash
    git worktree add -q --detach "$wt" "$full" || { echo "asv: no worktree for $c"; rm -rf "$tmp"; status=1; continue; }
    subject=$(git log -1 --format=%s "$full")
    echo "== asv: $machine, commit ${full:0:12} (${subject:0:90})"
    (cd "$wt" && CUDATTN_CACHE_DIR="$cache" PYTHONPATH="$wt" timeout 120 python3 -m cudattn cache warm --jobs "$(nproc)" \
        2>/dev/null | tail -1) || true
    # asv >= 0.6.5 puts ASV_PYTHONPATH on the benchmarks' sys.path; older 0.6.x use PYTHONPATH.
    CUDATTN_CACHE_DIR="$cache" PYTHONPATH="$wt${PYTHONPATH:+:$PYTHONPATH}" ASV_PYTHONPATH="$wt" \
        python3 -m asv run --python=same --launch-method spawn --machine "$machine" \
        --set-commit-hash "$full" --show-stderr || { echo "asv: failures for ${full:0:12}"; status=1; }
    git worktree remove --force "$wt"
    rm -rf "$tmp"
    took=$(( $(date +%s) - now ))
    echo "== ${full:0:12}: ${took} s"
    [ "$took" -gt "$slowest" ] && slowest=$took
done
python3 tools/asv_normalize.py "$machine" --python "$pyver"
if [ ${#left[@]} -gt 0 ]; then
    echo "not recorded (time budget): ${left[*]}"
fi
exit $status
