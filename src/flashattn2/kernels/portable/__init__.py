"""The portable Triton kernels (any CUDA GPU, and the interpreter) and their host plans."""
