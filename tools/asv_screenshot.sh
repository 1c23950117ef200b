#!/usr/bin/env bash
# Build the offline asv dashboard (tools/asv_publish.sh) and take headless-Chromium screenshots of
# it, to check that the graphs show points (not an empty page).
#
#   tools/asv_screenshot.sh OUT_DIR [BENCHMARK ...]     e.g. prefill.Prefill.track_tflops
#
# A BENCHMARK may carry asv's URL query, e.g. "decode.Decode.track_tbps?machine=h100".
# Needs chromium (Debian: apt-get install chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "$1"); shift
mkdir -p "$out"
tools/asv_publish.sh >/dev/null
port=$((20000 + RANDOM % 20000))
(exec python3 -m http.server -d .asv/html "$port" >/dev/null 2>&1) &
server=$!
trap 'kill $server' EXIT
sleep 1
shot() {
    timeout 90 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1000 \
        --virtual-time-budget=10000 --screenshot="$2" "http://127.0.0.1:$port/$1" >/dev/null 2>&1
    echo "$2"
}
shot "" "$out/asv_grid.png"
for b in "$@"; do shot "#$b" "$out/asv_$(echo "${b%%\?*}" | tr -c 'A-Za-z0-9._\n' '_').png"; done
