"""portattn's tooling, apart from the product: the command line (``python -m portattn``,
:mod:`portattn.tools.cli`), the accuracy check (``check``), the ahead-of-time compile check
(``compilecheck``), the benchmarks (``bench``, ``bench_decode``, ``bench_report``), the golden
output hashes (``golden``), the reference harness they and the tests share (``harness``) and
the distributed demo (``_distributed_demo``).

The product (``portattn.api``, ``ops``, ``kernels``, ``configs``, ...) never imports from here.
"""
