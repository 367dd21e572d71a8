"""Integrations of portattn into other libraries.

Each integration is a submodule that imports its library itself, so that ``import portattn``
and ``import portattn.integrations`` never need it:

- :mod:`portattn.integrations.transformers`: ``attn_implementation="portattn"`` (and
  ``"portattn_fixed_order"``) for Hugging Face transformers models, after ``register()``.
"""
