"""Sweep num_splits for decode shapes: TB/s of K/V/q/out bytes per split count, and the count the
heuristic (num_splits=None) picks. Device arrays, inputs rotated over copies larger than L2.

    python tools/decode_splits.py 1,32,8,131072 8,32,8,32768 --splits 1,8,16,33,66,132
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

import cudattn
from cudattn._kernels import decode as _decode
from cudattn._runtime import device as _device
from cudattn._runtime import launch as _launch
from cudattn._spec import validate as _validate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="+", help="B,Hq,Hkv,Sk (one query token, D=128, fp16)")
    ap.add_argument("--splits", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--page-size", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    props = _device.device_properties(0)
    for text in args.shapes:
        B, Hq, Hkv, S = (int(x) for x in text.split(","))
        D = 128
        nbytes = 2 * D * B * (2 * Hq + 2 * S * Hkv)
        sets = []
        for _ in range(max(2, -(-3 * props.l2_cache_size // nbytes))):
            q = rng.standard_normal((B, 1, Hq, D), dtype=np.float32).astype(np.float16)
            k = rng.standard_normal((B, S, Hkv, D), dtype=np.float32).astype(np.float16)
            sets.append(tuple(cudattn.to_device(x) for x in (q, k, k)))
        auto = _decode.make_plan(_validate.validate(*sets[0]), props, _device.get_device(0))[0].num_splits
        row = []
        for s in [None] + [int(x) for x in args.splits.split(",")]:
            def batch(s=s):  # 10 calls between two events: the host queues ahead of the GPU
                for i in range(10):
                    cudattn.attention(*sets[i % len(sets)], num_splits=s)

            ms = statistics.median([_launch.time_ms(batch) / 10 for _ in range(7)][2:])
            row.append(f"{'auto=' + str(auto) if s is None else s}: {nbytes / ms / 1e9:.2f}")
        print(f"{B}x{Hq}/{Hkv}x1/{S}x{D}  TB/s by splits  " + "  ".join(row), flush=True)


if __name__ == "__main__":
    main()
