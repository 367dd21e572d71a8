"""portattn's tooling, apart from the product: the command line (``python -m portattn``,
:mod:`portattn.tools.cli`), the accuracy check (``check``), the ahead-of-time compile check
(``compilecheck``), the golden output hashes (``golden``) and the reference harness they and
the tests share (``harness``). The benchmarks and the distributed demo are not shipped: they
live in the checkout's ``benchmarks/``, which nothing here imports.

The product (``portattn.api``, ``ops``, ``kernels``, ``configs``, ...) never imports from here.
"""
