"""Recording the golden files, a maintainer's job run from a checkout (docs/golden.md):
``python -m ci.golden_dev refresh`` (on a GPU of the family: the output hashes) and
``python -m ci.golden_dev fingerprints --update`` (on any CPU: the compile fingerprints and
keys); and CI's compile-key check, ``python -m ci.golden_dev keycheck``. The package keeps what
users check with: ``python -m portattn golden verify`` and ``golden fingerprints``, whose
reading of the files this builds on.
"""
