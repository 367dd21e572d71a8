"""Golden output hashes per GPU family: canonical cases (:mod:`.cases`), a counter-based input
generator (:mod:`.inputs`), hashing (:mod:`.hashing`), reading golden files (:mod:`.layout`,
:mod:`.records`), and the verify / fingerprints checks (:mod:`.verify`, :mod:`.fingerprints`;
docs/golden.md; design §5). Recording them is the checkout's ``ci/golden_dev``.

``import portattn.tools.golden`` does no GPU work (and imports none of its modules).
"""
