"""Layer 1, runtime: where arrays live and how work runs on them.

The device and the one NumPy-or-CuPy seam (`device`), the CUDA C runtime (`cuda/`: the CPU
emulator and CuPy's RawKernel behind one `Kernel`), the kernel families (`kernels/`, each a `.cu`
file with its launcher and its own NumPy reference), the CPU thread pool and BLAS thread control
(`cpu_threads`), the float32 matmul the CPU path calls (`blas`: MKL's when installed, else
NumPy's), the fused C++ row kernels of a training step (`host/`, compiled with g++ once per
machine), the caching allocator (`allocator`) and the counter-based RNG (`rng`).
Imports nothing else from the package.
"""
