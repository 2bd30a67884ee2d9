"""Triton kernels of FlashAttention-2: forward, backward and the small pieces they are built from."""
