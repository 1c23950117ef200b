#!/usr/bin/env bash
# Build the asv dashboard from the committed results and take headless-Chromium screenshots of it,
# to check that the graphs show points (not an empty page).
#
#   tools/asv_screenshot.sh OUT_DIR [BENCHMARK ...]     e.g. numpy_path.NumpyEndToEnd.time_numpy_end_to_end
#
# The page loads jQuery, flot, bootstrap, stupidtable and md5 from CDNs. Offline, a copy of it is
# pointed at Debian's packages instead (apt-get install chromium libjs-jquery libjs-jquery-flot
# libjs-bootstrap libjs-jquery-stupidtable node-blueimp-md5); flot 4 there bundles the time,
# selection and categories plugins the CDN page loads one by one.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "$1"); shift
mkdir -p "$out"
python3 -m asv publish >/dev/null
site=$(mktemp -d)/html
cp -r .asv/html "$site"
if ! curl -sfI --max-time 5 https://code.jquery.com >/dev/null 2>&1; then
    js=/usr/share/javascript
    mkdir -p "$site/ext"
    cp $js/jquery/jquery.js $js/jquery-flot/jquery.flot.js $js/jquery-stupidtable/stupidtable.js \
       $js/blueimp-md5/md5.js $js/bootstrap/js/bootstrap.js $js/bootstrap/css/bootstrap.min.css "$site/ext/"
    python3 - "$site/index.html" <<'PY'
import re, sys
path = sys.argv[1]
s = open(path).read()
for pat, local in ((r"jquery-[\d.]+\.min\.js", "jquery.js"), (r"flot/[\d.]+/jquery\.flot\.min\.js", "jquery.flot.js"),
                   (r"stupidtable\.min\.js", "stupidtable.js"), (r"md5\.min\.js", "md5.js"),
                   (r"bootstrap\.min\.js", "bootstrap.js"), (r"bootstrap\.min\.css", "bootstrap.min.css")):
    s = re.sub(r'"https://[^"]*' + pat + '"', f'"ext/{local}"', s)
s = re.sub(r'<script[^>]*src="https://[^"]*"[^>]*></script>', "", s)  # plugins flot 4 already bundles
s = re.sub(r' integrity="[^"]*"', "", s)  # the local files are other builds than the pinned hashes
open(path, "w").write(s)
PY
fi
port=$((20000 + RANDOM % 20000))
(cd "$site" && exec python3 -m http.server "$port" >/dev/null 2>&1) &
server=$!
trap 'kill $server' EXIT
sleep 1
shot() {
    timeout 90 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1000 \
        --virtual-time-budget=10000 --screenshot="$2" "http://127.0.0.1:$port/$1" >/dev/null 2>&1
    echo "$2"
}
shot "" "$out/asv_grid.png"
for b in "$@"; do shot "#$b" "$out/asv_$b.png"; done
