"""Plausible wrong solutions of T09's exercises (format: tests/test_mutants.py)."""

_CONFIG = """
return {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": c.vocab_size,
    "hidden_size": c.dim,
    "intermediate_size": c.ffn_dim,
    "num_hidden_layers": c.n_layers,
    "num_attention_heads": c.n_heads,
    "num_key_value_heads": c.n_kv_heads,
    "head_dim": c.head_dim,
    "hidden_act": "silu",
    "max_position_embeddings": c.max_seq_len,
    "rms_norm_eps": c.norm_eps,
    "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
    "rope_theta": c.rope_theta,
    "tie_word_embeddings": False,
    "attention_bias": False,
}
"""

MUTANTS = {
    "T09.1": {
        "normalised over the heads axis": """
            ms = np.mean(x * x, axis=2, keepdims=True)
            return x / np.sqrt(ms + eps) * weight
        """,
        "eps outside the square root": """
            ms = np.mean(x * x, axis=-1, keepdims=True)
            return x / (np.sqrt(ms) + eps) * weight
        """,
        "one mean square per position (heads flattened together)": """
            B, T, H, D = x.shape
            ms = np.mean((x * x).reshape(B, T, H * D), axis=-1)[..., None, None]
            return x / np.sqrt(ms + eps) * weight
        """,
        "weight forgotten": """
            ms = np.mean(x * x, axis=-1, keepdims=True)
            return x / np.sqrt(ms + eps)
        """,
    },
    "T09.2": {
        "head_dim left out (transformers derives dim / heads)": _CONFIG.replace('    "head_dim": c.head_dim,\n', ""),
        "kv heads set to the query heads": _CONFIG.replace('"num_key_value_heads": c.n_kv_heads', '"num_key_value_heads": c.n_heads'),
        "tied embeddings": _CONFIG.replace('"tie_word_embeddings": False', '"tie_word_embeddings": True'),
        "intermediate_size from 4 * dim": _CONFIG.replace('"intermediate_size": c.ffn_dim', '"intermediate_size": 4 * c.dim'),
    },
}
