"""portattn's tooling, apart from the product: the command line (``python -m portattn``,
:mod:`portattn.tools.cli`) with what users check bits and configurations with (``check``,
``compile``, ``golden verify`` / ``fingerprints``, ``config``) and the reference harness they and
the tests share (``harness``). Not shipped: the benchmarks and the distributed demo (the
checkout's ``benchmarks/``) and the recording of the golden files (``ci/golden_dev/``).

The product (``portattn.api``, ``ops``, ``kernels``, ``configs``, ...) never imports from here.
"""
