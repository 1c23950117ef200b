"""`python -m cudattn bench`: cudattn's speed on the GPU, beside its peers, in one table.

Modules, in the order a run uses them: `grids` (what to measure), `ceilings` (what the GPU can
do at best, measured in the same run), `timing` (CUDA events, queued behind a spin kernel),
`inputs` (random inputs, rotated copies larger than L2), `check` (correctness of each row
against the float64 reference, subsampled), `peers` (torch SDPA backends, when torch is
importable), `runner` (one row per case), `ascalled` (each row's calls timed as their caller
sees them: one call on an idle stream, and back to back), `hostmode` (the NumPy end-to-end
call), `overhead` (`--grid overhead`: host time per call by operand kind, beside torch SDPA's),
`backward` (`--grid backward`: the backward alone, deterministic, and a training step, each
beside torch SDPA's backward, checked by `check_backward`), `manifest` (the environment),
`report` (table, Markdown, JSON) and `plot` (matplotlib).

The library itself never imports torch: only `peers` does, and only when asked.
"""
