"""portattn's benchmarks and the distributed demo: run from a checkout, not shipped.

- ``python benchmarks/bench.py``: both kernels against SDPA and FlexAttention (``--decode``: the
  decode/append benchmark against a KV cache; ``plot``: the chart from a run's JSON), built
  from ``workloads.py`` (the packs), ``peers.py`` (the implementations it times),
  ``timing.py`` (do_bench, graphs, pass order) and ``bench_report.py`` (tables, chart);
  ``--decode`` is ``bench_decode.py`` on ``decode_workloads.py``;
- ``python benchmarks/distributed_demo.py``: context- and tensor-parallel attention on several
  processes, checked against one;
- ``python benchmarks/features.py``, ``transformers_llama.py``, ``api_overhead.py``: the speed
  rows of docs/performance.md beyond the main benchmark.

Each script puts the checkout's root on ``sys.path`` when run by path, so ``benchmarks.*`` and an
uninstalled ``portattn`` import; the tests import them as ``benchmarks.*`` (pytest's
``pythonpath = ["."]``). The package (``portattn/``) never imports from here.
"""
