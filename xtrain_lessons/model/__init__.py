"""Layer 3, model: the Qwen3-style transformer and everything its forward pass uses.

Fused layers (`layers`: linear, RMSNorm, RoPE, SwiGLU, attention), attention variants
(`flash_attention`, `gqa`), `dropout`, activation `recompute`, reduced `precision` (bf16), the
model itself (`qwen3`), decoding (`generate`) and ragged batches (`batching`).
May import `runtime` and `autograd`.
"""
