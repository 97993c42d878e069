"""CUDA C kernels: one .cu file per kernel family, beside a .py launcher with a NumPy reference."""
