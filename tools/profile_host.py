"""Where the host time of one warm attention() call goes (cProfile), device arrays and torch tensors.

    PYTHONPATH=. python tools/profile_host.py      (needs torch with CUDA; not part of the asv suite)
"""

import cProfile
import pstats

import torch

import cudattn

q = torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16)
qd = cudattn.to_device(q.cpu().numpy())
stream = torch.cuda.current_stream()
for label, fn in (("DeviceArray", lambda: cudattn.attention(qd, qd, qd, stream=stream)),
                  ("torch", lambda: cudattn.attention(q, q, q, layout="bhsd", stream=stream))):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for i in range(2000):
        fn()
        if i % 200 == 199:
            torch.cuda.synchronize()
    pr.disable()
    print(f"===== {label}")
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)
