#!/usr/bin/env bash
# The C build of docs/C_API.md, end to end, against the INSTALLED cudattn (`python` on PATH; $PYTHON
# overrides it), from any directory: export the kernels, compile and link the exported example with
# the flags `export --print-cflags` prints (-ldl -lm, no -lcuda), and run it. Without a CUDA driver
# or GPU the example must stop with its documented exit status 3 and say why; with a GPU it must
# pass its check. Exits non-zero on any failure; its temp dir is removed in every case.
#
# Target: $CUDATTN_C_EXAMPLE_ARCH, else the GPU's (as `cudattn info` reports it), else sm_80 (the
# cheapest export). The export goes through the kernel cache, so a warm cache makes it fast.
set -euo pipefail

py=${PYTHON:-python}
work=$(mktemp -d "${TMPDIR:-/tmp}/cudattn-c-example.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"

arch=${CUDATTN_C_EXAMPLE_ARCH:-}
if [ -z "$arch" ]; then
    arch=$({ "$py" -m cudattn info 2>/dev/null || true; } | sed -n 's/.*(target \(sm_[0-9a-z]*\)).*/\1/p' | head -n 1)
    arch=${arch:-sm_80}
fi
echo "c_example: exporting for $arch with $("$py" -c 'import sys, cudattn; print(cudattn.__file__, sys.executable)')"
"$py" -m cudattn export --arch "$arch" --out "$work/export" --jobs "$(getconf _NPROCESSORS_ONLN)" >"$work/export.log" 2>&1 ||
    { cat "$work/export.log"; echo "c_example: the export failed" >&2; exit 1; }
tail -n 3 "$work/export.log"

cflags=$("$py" -m cudattn export --print-cflags --out "$work/export" 2>"$work/cflags.err") ||
    { cat "$work/cflags.err" >&2; echo "c_example: export --print-cflags failed" >&2; exit 1; }
eval "flags=($cflags)"  # the printed flags are shell-quoted
echo "c_example: cc -std=c11 -O2 -Wall -Wextra -Werror $cflags export/examples/attention.c -ldl -lm -o attention"
cc -std=c11 -O2 -Wall -Wextra -Werror "${flags[@]}" "$work/export/examples/attention.c" -ldl -lm -o "$work/attention"

status=0
"$work/attention" "$work/export" >"$work/run.out" 2>"$work/run.err" || status=$?
cat "$work/run.out" "$work/run.err"
case $status in
0)
    echo "c_example: built, linked and ran; the example passed its check" ;;
3)
    grep -Eq "^(no CUDA driver|no CUDA device)" "$work/run.err" ||
        { echo "c_example: exit status 3 without the no-driver/no-GPU message" >&2; exit 1; }
    echo "c_example: built and linked; no CUDA driver or GPU here, so the example stopped with status 3 as documented" ;;
*)
    echo "c_example: the example failed with exit status $status" >&2
    exit 1 ;;
esac
