"""Layer 5, measure: numbers about the engine — the training benchmark against PyTorch (`bench`),
the op profiler (`profiler`), the whole-step memory report (`memory_report`) and the
data-parallel experiments the launcher runs (`ddp_experiments`).

May import every layer up to `training`; not `interop`, `course` or `cli`.
"""
