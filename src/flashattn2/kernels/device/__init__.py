"""@triton.jit device helpers that the portable Triton kernels and the Gluon kernels call."""
