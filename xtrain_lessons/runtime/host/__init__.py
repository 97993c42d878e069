"""Host (CPU) kernels in C++: the fused row ops of a training step, compiled with g++ for the
machine they run on (`fused_rows.cpp`, its launchers and NumPy references in `fused_rows.py`)."""
