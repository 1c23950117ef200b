#!/usr/bin/env bash
# Build the asv dashboard from the committed results into .asv/html, working offline: the page's
# CDN libraries are replaced by the copies in tools/asv_assets/. Serve it with
#   python3 -m http.server -d .asv/html 8080        (then open http://127.0.0.1:8080)
# (opened from file://, most browsers refuse to load its data).
#
#   tools/asv_publish.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python3 tools/asv_publish.py >/dev/null  # asv publish, its regressions page right for rates
html=.asv/html
mkdir -p "$html/ext"
cp tools/asv_assets/*.js tools/asv_assets/*.css "$html/ext/"
python3 - "$html/index.html" <<'PY'
import re, sys
path = sys.argv[1]
s = open(path).read()
for pat, local in ((r"jquery-[\d.]+\.min\.js", "jquery.min.js"), (r"flot/[\d.]+/jquery\.flot\.min\.js", "jquery.flot.js"),
                   (r"stupidtable\.min\.js", "stupidtable.min.js"), (r"md5\.min\.js", "md5.js"),
                   (r"bootstrap\.min\.js", "bootstrap.min.js"), (r"bootstrap\.min\.css", "bootstrap.min.css")):
    s, n = re.subn(r'"https://[^"]*' + pat + '"', f'"ext/{local}"', s)
    if n != 1:
        sys.exit(f"asv_publish: the page no longer loads {local} as expected (found {n} times): update this script")
# the flot plugins the bundle already holds, and orderBars (bar charts of categorical axes only)
s = re.sub(r'<script[^>]*src="https://[^"]*"[^>]*></script>\s*', "", s)
s = re.sub(r' integrity="[^"]*"', "", s)  # the local files are other builds than the pinned hashes
# flot 4 draws the legend as SVG over a rect that asv's page leaves unfilled (black)
s = s.replace("</head>", "<style>.legendLayer rect.background { fill: #fff; fill-opacity: 0.9; stroke: #ccc; }</style>\n</head>", 1)
if "https://" in re.sub(r'href="https://[^"]*"', "", s):
    sys.exit("asv_publish: the page still loads something from the network")
open(path, "w").write(s)
PY
echo "$html (offline; serve it with: python3 -m http.server -d $html 8080)"
