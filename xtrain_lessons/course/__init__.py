"""Layer 5, course: what serves the notebooks — exercise checks (`checks`), the notebook
pipeline (`notebooks`: learner versions from solutions, execution) and the machine check
(`doctor`).

May import every layer up to `training`; not `interop`, `measure` or `cli`.
"""
