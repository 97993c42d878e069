"""Layer 5, interop: the engine's models in other tools' formats (Hugging Face, `hf`).

May import every layer up to `training`; not `measure`, `course` or `cli`.
"""
