#!/usr/bin/env bash
# Session 54 (30 device-minutes; check `status` first: refused starts cost 90-180 s each):
# 1. On an H200 (carry .fa4): `bash ci/gpu_next.sh s53` (~7 min): golden verify, the H200
#    decode table with the swapped decode on (docs/bench-decode-h200.* is still session 46's)
#    and the eager host time. On an H100 it runs the verify only: run `odd` / `even` instead.
# 2. The GPU suite in two halves (`bash ci/gpu_next.sh odd` / `even`, -n 12): session 53's odd
#    half reached 858 of 863 items in 540 s (tests/test_property_features.py was running):
#    give it PYTEST_LIMIT=580 and the call 595 s.
# 3. `bash ci/gpu_next.sh gidx` (~5 min): the captured calls' index kernels, 6 -> 3 a call
#    (perf-notes row 132, not measured on a GPU yet), old against new, and the capture / replay
#    / rollout GPU tests. Put it first if no H200 comes.
# 4. `bash ci/gpu_next.sh d64var` if time is left (perf-notes rows 129, 131).
# Session 53 ran (H100; six refused or unasked calls first cost ~480 device-s, one cold start
# at 00:12 UTC): `PYTEST_LIMIT=540 bash ci/gpu_next.sh odd` (839 passed, 19 skipped, none
# failed; 5 of 863 items unfinished at the limit) and `bash ci/gpu_next.sh even` (851 passed,
# 345 skipped, none failed, 494 s).
# Session 52 ran (H100; four refused calls cost 376 s): `bash ci/gpu_next.sh swap_ship`
# (part removed with its patch in d27c7ba: the swapped decode on, golden refresh same bits on
# 8 cases, 240 tests passed), `bash ci/gpu_next.sh s52` (its verify ran on the tree without
# the switch; the three-group round, 27 tests passed), `bash ci/gpu_next.sh g3` (verify 32/32
# with the switch; the round again with each causal group's own key tiles; 114 passed), then
# 288 + 93 + 111 tests of the invariance, rollout, replay, launch and integration paths
# (perf-notes rows 129-130).
# Session 51 ran (H100, one cold start after eight refused ones): `bash ci/gpu_next.sh swap`
# (the swapped decode: bits equal on every row, 33 tests passed; +10-12% B1, +3-5% B8 and
# GQA 8/1: perf-notes row 127), `bash ci/gpu_next.sh d64ab` (no d64 regression since 244bb29:
# row 128), then tests/test_decode_ws.py tests/test_kvcache.py (133 passed) and golden verify
# of sm90 (32/32).
# Session 50 ran (H100 both times; one refused start): `bash ci/gpu_decode_ws.sh split_ship`
# (the Gluon split on: refresh same bits on 13 d128 cases), `bash ci/gpu_next.sh llama` (the
# "second sync" was the sync-debug prototype warning), `bash ci/gpu_decode_ws.sh bench`
# (docs/bench-decode-h100.*), `bash ci/gpu_next.sh s50` (verify 32/32 rerun alone; 288 tests
# passed) and 4 feature/compat test files (179 passed); perf-notes row 124.
# Session 49 ran (H200): `bash ci/gpu_next.sh s49` (kept maps' GPU tests 75 passed, the Gluon
# split's bits 16 passed, host A/B lost in the host's noise, the llama profile) and
# `ci/gluon_split_ab.py` (perf-notes row 123).
# Session 48 ran (H100, ~1,600 s held): `bash ci/gpu_decode_ws.sh ab` (bits equal on every row),
# the sm90 d128 decode switched to the Gluon kernel (golden refresh same bits, verify 32/32,
# 306 + 514 GPU tests passed), `bash ci/gpu_decode_ws.sh bench` (perf-notes row 122).
# Session 47 ran (H100): `bash ci/gpu_next.sh first` (golden verify 32/32; the Gluon decode A/B,
# perf-notes row 121), `bash ci/gpu_next.sh odd` (680 passed, 1 failed) and `even` (907 passed,
# 1 failed; both failures tests that assumed no GPU, fixed).
# Session 46 ran (H200): `bash gpu_slices.sh` (ci/, removed in 87a186f; in git at 96f601a;
# row 120: head slices slower, removed), the full benchmark with --passes 4
# (docs/bench-h200.*), the decode benchmark (docs/bench-decode-h200.*) and golden verify
# (32/32).
# Session 45 ran (H100): `bash ci/gpu_chunk_ship.sh all` (C = 16,384 shipped: refresh 30 same
# bits + 2 split cases, verify 32/32, 166 tests passed), the decode benchmark (row 118), the
# rollout / invariance / graph / replay GPU tests (380 passed); then four refused starts
# (01:00-01:43 UTC) spent the rest, so the head slices (row 119) went unmeasured.
# Session 44 ran (H100; five refused starts cost ~1,100 s): `python3 ci/chunk_size_ab.py` and
# `python3 ci/c16k_probe.py` (perf-notes row 116: C 16384 costs the training forward nothing
# measurable and doubles a 32k decode at B1-B2; C 8192 costs 2.5-3.7%), then the GPU tests of
# the ops / key chunk (102 passed). Its refresh call for C found no device.
# Session 44, first (~6-8 min, carry nothing; session 43's device time went on refused starts
# before it could run): `python3 ci/chunk_size_ab.py > $OUT/chunk.log 2>&1; grep -E "^\|"
# $OUT/chunk.log` (limit 560 s; it prints the decode rows, then the forward's, then the bits,
# so a cut run keeps the first; `--quick` is varlen on 1x16384 / 1x32768 and B1 / B8 x 32k).
# Issue 37's key split is built (design §3.1) but off in every entry: C 2048 / 4096 cost the
# training forward +9.5% / +7.2% on one 16k-key sequence (perf-notes row 96) and nothing on
# packs whose sequences are no longer than C (they run the unchunked code). This measures C
# 4096 / 8192 / 16384 on the forward as it would ship (the Gluon forward parking its
# accumulator; d64 Triton) on 4x4096, 2x8192, 1x16384, 1x32768, against the decode they give
# (split_decode_ab's rows: each C split and unsplit, their bits equal) at B1 x 32k, B8 x 32k,
# B1, B8, B64, and checks a 32k prefill row == its decode row at each C, both kernels. It decides whether an entry can ship a C (the forward's cost on long
# sequences against issue 37's 2%), and which.
# Second, on an H200 if one comes (carry .fa4, ~10 min alone, limit 595): the full benchmark
# with the heat and four passes (docs/bench-h200.* is still the two-pass run of 30c2186):
#   source .fa4/install.sh; python3 benchmarks/bench.py --passes 4 --json $OUT/bench-h200.json \
#     --markdown $OUT/bench-h200.md --png $OUT/bench-h200.png > $OUT/bench.log 2>&1
# Session 43 ran (H100; then refused starts cost 645 of its device-s): the full benchmark
# with --passes 4 (docs/bench-h100.*, perf-notes row 113: every varlen row's spread <= 3.6%, no
# pass favoured), the swap probes (row 114: products keep bits, row sums do not), `tune_sm90.py
# --round d64-forward-host` (no tile beats the table) and transformers_llama.
# Session 42 ran (H100, after one refused request): the full benchmark and transformers_llama
# (docs/bench-h100.*, row 111), the GPU suite in two halves (674 + 857 passed, none failed),
# golden verify 30/30, the decode benchmark (docs/bench-decode-h100.*: `python3
# benchmarks/bench.py --decode`).
# The next session's GPU calls (30 device-minutes a session; a cold start costs 1.5-3 of them;
# a refused start costs 15 s or more: check `status` first).
# Session 42, first (carry .fa4, ~6 min): the full benchmark as in session 41's third call
# below (fixed_order d64/d128 landed in session 41: rows 109; docs/bench-h100.* predates it;
# an H200: docs/bench-h200.*), then `python3 benchmarks/transformers_llama.py` (~1.5 min).
# Second and third: the whole GPU suite in two halves (session 41's fourth item), without -x.
# Session 41 ran (H100, after twelve refused requests from 13:00 to 15:02 UTC that cost
# ~1,000 of its 1,800 device-s): its first call (ws_same_bits 44 passed; refresh: the 11
# stale outputs same bits), its second (golden verify 30/30; launch-path tests 114 passed)
# and the backward replay's A/B and tests of its third (row 110: kept); plus the rollout,
# invariance, kvcache, CUDA-graph and family-tile GPU tests with -k fixed_order (138 passed).
# Session 41, first (~6 min; on branch wip/fixed-order-ws, perf-notes row 109: fixed_order d64
# runs the family row with its Gluon dK/dV, fixed_order d128's forward is the Gluon kernel at
# (128, 64, 8, 3); fingerprints recorded on the CPU, the sm90 golden outputs of those entries
# stale): `git checkout wip/fixed-order-ws` here (rebase on main first if main moved), then
#   python3 -m pytest -q tests/test_table_variants.py -k ws_same_bits -p no:cacheprovider; \
#   python3 -m ci.golden_dev refresh --family sm90 > $OUT/refresh.log 2>&1; \
#   cp golden/sm90.json $OUT/; tail -n 20 $OUT/refresh.log; \
#   python3 ci/tune_sm90.py --round fixed-order-d64-bwd-ws    # (bits column fixed in 40)
# refresh should say "same bits" for every case (the Gluon kernels keep the Triton kernels'
# bits at these tiles: ws_same_bits passed on an H100 in session 40). Copy the returned
# golden/sm90.json into the branch, commit; second call: `python3 -m portattn golden verify
# --family sm90` (30/30) and the GPU tests of the launch paths (tests/test_launcher.py
# tests/test_table_variants.py tests/test_fixed_order.py -n 12); then merge into main. Third
# (carry .fa4, ~6 min): the full benchmark (H200: docs/bench-h200.*; H100: docs/bench-h100.*).
# With it (~1 min), the backward replay's host time (f17547b, CPU-verified only), alternating:
#   for f in "" --plan-backward "" --plan-backward; do python3 benchmarks/host_overhead.py \
#     --gpu --cases varlen_train,varlen_grad --n 500 $f | grep "^| varlen"; done
# and its GPU bits: python3 -m pytest -q tests/test_backward_replay.py tests/test_ops.py -n 8;
# then `python3 benchmarks/transformers_llama.py` (~1.5 min; issue 36's transformers target:
# session 28's table in docs/performance.md predates the replays of rows 87-92 and this one).
# Session 40 ran (H100): both tune rounds below (row 109), `PROCS=3 bash ci/gpu_variance.sh`
# (steady, row 109), the full benchmark (docs/bench-h100.*, 333 s), the GPU suite in two halves
# (odd: 800 passed, 3 failed, stopped by -x: a dense kvcache of 9 rows did not compile on sm90,
# fixed in cc115c6 and rerun: 218 passed; even: 643 passed, 322 skipped).
# Session 40, first (~5 min warm; carry nothing): `bash ci/gpu_variance.sh` (issue 36's <= 5%
# spread: the skewed 16k d64 causal forward+backward of varlen took 1.16-1.70 ms in four
# processes of one code in session 39, its forward 0.28-0.31; per-kernel µs per process say
# which kernel, or the gaps, moves). Second (~7 min): `python3 ci/tune_sm90.py --round
# fixed-order-d64-bwd-ws` (fixed_order d64's dK/dV as the Gluon kernel at its own tiles: row
# 53 measured -22%/-29% for varlen d64's dK/dV this way, same bits; never timed for
# fixed_order d64; CPU-compiled without spills), then `--round fixed-order-ws` (fixed_order's
# forward warp-specialised at 64-key tiles, d128 and d64; CPU-compiled, no spills). A variant
# is adoptable where its bits column shows the table's hash and `python3 -m pytest -q
# tests/test_table_variants.py -k "ws_same_bits"` passes (fixed_order d64 added there in
# session 39, both the forward and dK/dV; ~1 min); then set the field in
# portattn/configs/rows.py, re-record fingerprints on the CPU and verify golden in a later call.
# Then `--round d64-forward-host` if time is left.
# Third (carry .fa4, ~8 min): the full benchmark as below, on whichever card comes (an H200:
# docs/bench-h200.*; an H100: docs/bench-h100.*, whose table of 02789fd predates row 108's
# dK/dV); it now times torch's varlen_attn too (session 39; torch 2.11 lacks enable_gqa, so its
# GQA rows record that). With time left, `--seeds 2 --workloads seed1` (~3.5 min: the skewed
# packs of another seed). Fourth and fifth (next session if the budget is spent): the whole
# GPU suite in two halves (session 39's one call reached 49% in its 420 s on a cold machine,
# no failure; golden verify 30/30):
#   python3 -m pytest $(ls tests/test_*.py | awk 'NR % 2 == 1') -q -n 12 -p no:cacheprovider
#   python3 -m pytest $(ls tests/test_*.py | awk 'NR % 2 == 0') -q -n 12 -p no:cacheprovider
# Session 39 ran (H100): the full benchmark (docs/bench-h100.*), the GPU suite (49% in 420 s,
# no failure) and golden verify, `D128=1 bash ci/gpu_tl_descriptors.sh ab-bwd
# ci/patches/tl_host_dkdv.diff` and `tests` with it (row 108: landed).
# Session 39, first (H200, carry .fa4; ~8 min): the full benchmark, as session 38 planned
# below (sessions 38 and 37 got H100s only; docs/bench-h200.* predates perf-notes rows 105-106),
# then docs/performance.md's table and targets from it. Second (~6 min): the whole GPU suite
# on the H200 (`bash ci/h200_suite.sh` with REFRESH=0 and BENCH_LIMIT=1, or `bash ci/gpu_next.sh
# 3`): rows 105-106 moved the Gluon kernels and the Triton forward onto host descriptors and
# only the launch paths' tests and golden verify ran, on H100s. Then, for issue 36: the
# Triton dK/dV (fixed_order at every head dim, varlen d96) still makes its descriptors in each
# program (136 tensormap PTX lines at fixed_order d128): `D128=1 bash ci/gpu_tl_descriptors.sh
# ab-bwd ci/patches/tl_host_dkdv.diff` (~4 min warm; row 108: CPU-compiled, registers no
# higher, interpreter bits equal), then `bash ci/gpu_tl_descriptors.sh tests
# ci/patches/tl_host_dkdv.diff` if it gains (~7 min), then fingerprints on the CPU. Also
# (~3 min): `python3 ci/tune_sm90.py --round d64-forward-host` (the d64 Triton forward's query
# tiles and stages with the host descriptors; 64-key tiles keep the bits; CPU-compiled: ok).
# Session 38 ran (H100): `bash ci/gpu_tl_descriptors.sh` ab / tests / ab-bwd (rows 106-107;
# the forward landed, dQ's patches not kept) and `ci/tune_sm90.py --round d64-dq-ws` (row
# 107: the Gluon dQ at d64 3-4% slower, not kept).
# Session 38, first (H200, carry .fa4; ~8 min): the full benchmark after the host descriptors
# (perf-notes row 105; docs/bench-h200.* predates them), as docs/performance.md's command:
#   source .fa4/install.sh; python3 benchmarks/bench.py --json $OUT/bench-h200.json \
#     --markdown $OUT/bench-h200.md --png $OUT/bench-h200.png
# then docs/performance.md's table and targets from it. Second (~3 min): `python3
# ci/tune_sm90.py --round d64-dq-ws` (the dQ Gluon kernel at d64, both kernels; CPU-compiled
# spill-free, same bits by its tiles; not yet timed). Session 37 ran (on an H100) the
# descriptors' A/B, golden verify and GPU tests (landed, row 105) and the three-group d64
# forward (row 104: not kept); its GPU-host check of tests/test_interpreter_bits.py found
# numpy 2.5.2 there (outside the pin < 2.4), whose AVX-512 loops are named X86_V4.
# Session 37, before or after the first call, ~30 s (session 36's CI fix, not yet seen on an
# AVX-512 CPU): does the record of tests/test_interpreter_bits.py hold on the GPU host's CPU
# with numpy's AVX-512 loops off (pass), and does the test refuse where they are on (fail
# with its message, if the host has AVX-512)?
#   grep -o -m1 avx512f /proc/cpuinfo; for e in on off; do [ $e = on ] && export \
#   NPY_DISABLE_CPU_FEATURES="AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX \
#   AVX512_CNL AVX512_ICL AVX512_SPR" || unset NPY_DISABLE_CPU_FEATURES; CUDA_VISIBLE_DEVICES= \
#   TRITON_INTERPRET=1 python3 -m pytest -q -p no:cacheprovider tests/test_interpreter_bits.py \
#   | tail -n 2; done
# Session 37, first (issue 36, perf-notes row 103; carry .fa4; ~7 min with a cold start):
#   WORKLOADS=short bash ci/gpu_fwd_variant.sh ci/patches/gluon_host_descriptors.diff \
#     ci/patches/gluon_host_descriptors.diff+ci/patches/gluon_host_descriptors_store.diff
# The Gluon forward reading q, k and v through host-made ragged descriptors (one per tensor
# and launch, a kernel parameter; no tensormap written and fenced in each program: the sm90
# d128 forward's PTX loses its 45 tensormap lines), then also storing out by a ragged TMA
# store (2 UTMASTG for 68 STG). Bits must equal main's (the hashes); rows past a sequence's
# end read 0 and are not written, as with today's per-sequence descriptors. If the smoke step
# fails on a patch (rc != 0), its log says why (cuTensorMapEncodeTiled's limits?). The last
# version's Gluon tests run (and tests/test_launcher.py's GPU tests of the kept launches)
# for the patch's host side. Second:
#   WORKLOADS=short FWD_BWD=1 bash ci/gpu_fwd_variant.sh ci/patches/gluon_host_descriptors.diff+\
#     ci/patches/gluon_host_descriptors_store.diff+ci/patches/gluon_host_descriptors_dq.diff \
#     ci/patches/gluon_host_descriptors.diff+ci/patches/gluon_host_descriptors_store.diff+\
#     ci/patches/gluon_host_descriptors_dq.diff+ci/patches/gluon_host_descriptors_dkdv.diff
# (dQ, then dK/dV too, on the same descriptors; gradients' bits and fwd+bwd times). What gains
# lands (the patches carry the launcher's, replays' and compile check's side and CPU tests),
# after the whole GPU suite on it (tests/test_table_variants.py's
# test_ws_kernels_read_no_row_of_the_next_sequence_gpu among them), then fingerprints
# (`python -m ci.golden_dev fingerprints --update`, both Tritons), then `golden verify --family
# sm90` in a later call. Session 36 had no device (none lent): its planned first call,
# below, is still to run; the patches above subsume its producer-descriptor and TMA-store
# patches (its ablations remain informative).
# Session 36's planned first call (issue 36, perf-notes row 102; carry .fa4; ~8 min):
#   WORKLOADS=short bash ci/gpu_fwd_variant.sh \
#     ci/patches/ablate_fwd_no_keys.diff ci/patches/ablate_fwd_no_out_store.diff \
#     ci/patches/gluon_producer_descriptors.diff ci/patches/gluon_tma_store_out.diff
# The two ablations (wrong output, their bits differ by design) time a program without its
# key loop and without its out store: the fixed cost per program on the RL packs, where the
# forward is 0.67-0.76x FA4. Then the Gluon forward's descriptors made by the producer, each
# before its first copy (Q's copy waits for one, not three), and out through shared memory
# and a TMA store as well (8 STSM + 1 UTMASTG for 32 uncoalesced STG); their bits must equal
# main's. Second call, if one gains: the full default WORKLOADS with it (and with
# +ci/patches/gluon_compact_grid.diff). Whatever is kept: land
# it, re-record fingerprints on the CPU, `python -m portattn golden verify --family sm90` in
# a later call. Session 35 ran ci/gpu_fwd_variant.sh's three patches (rows 99-101), golden
# verify sm90 (30/30 bitwise on an H100, after row 98) and ci/gpu_overhead.sh (row 102).
# Open since session 34: after a change to the Gluon forward's key loop that keeps the wait for P V after
# the softmax (perf-notes row 97; check first on the CPU that ptxas prints no C7511/C7514 line
# and that the DEPBAR.LE gsb0, 0x0 follows the MUFU.EX2s), `bash ci/gpu_barriers.sh`-style A/B:
# `python ci/wait_barrier_probe.py --fa4` on main and on the change in alternating processes
# (bits must match), then `bash ci/gpu_stalls.sh`. Golden: `python -m portattn golden verify
# --family sm90` after any machine-code change.
# Session 34 ran ci/gpu_ncu.sh, ci/gpu_barriers.sh, ci/gpu_stalls.sh (row 97), an A/B of kernel-file copies
# (row 98: FA4's order in the Gluon forward's step, landed). Session 35, first: `python -m portattn
# golden verify --family sm90` (the sm90 varlen d128 forward's machine code changed in row 98; its
# outputs should not have).
# Session 34, first (done): with .fa4 carried, `source .fa4/install.sh; PYTHONPATH=. python3
# ci/host_peers.py --kernels --n 200` (~1.5 min with a cold start): where a small varlen
# forward's 37.7 us of GPU time go (FA4 det: 16.8; perf-notes row 96). Then, for issue 37's C:
# `bash ci/gpu_park.sh forward` after any change to the Gluon forward's chunk loop (~4 min).
# Session 33 ran `bash ci/gpu_park.sh` and `bash ci/gpu_park.sh forward` (perf-notes row 96).
# Session 31: first `bash ci/gpu_split.sh tests`, then `bash ci/gpu_split.sh bench` with .fa4
# carried (the split decode: GPU tests of the decode paths and tests/test_key_chunk.py, golden
# verify sm90; ci/split_decode_ab.py's bits, decode TB/s at C 2048 and the training forward's
# cost of C; ~12 min with a cold start).
# Session 31 ran `bash ci/gpu_host.sh` (213 passed; host A/B on an H100, perf-notes row 93) and
# part 3 (533 passed, no failure, cut by its limit at 90%).
# Session 30 ran part 1 (GPU tests of the kept launches 240 passed, golden verify sm90 30/30,
# decode_paged_ab as row 91) and part 6 (host times, transformers) on main 3a3e588, and a host
# A/B (perf-notes row 92). What is left, in this order:
#   0. bash ci/gpu_host.sh     # first: the GPU tests of the launch paths with the direct
#                              # launches (launch_directly, 08f566a: CPU-verified only), the
#                              # key split's (tests/test_key_chunk.py: d11b0a9, CPU only) and the
#                              # host A/B against ab_base/ (git archive 1759810 portattn
#                              # benchmarks | tar -x -C ab_base, untracked)         (~5 min)
#   2. bash ci/gpu_next.sh 2   # the repair passes at 4 warps (ci/patches/repair_four_warps.diff;
#                              # rows 81, 84: now mostly the dK/dV repairs, 2 x 18 us at 8x2048):
#                              # bench_repair on main, then patched, and the GPU unseen-key
#                              # tests on the patched tree; reverted after          (~6 min)
#   3. bash ci/gpu_next.sh 3   # tests test_[a-h]* (session 27: 571 passed, 97% within the limit)
#                              # (~9 min)
#   4. bash ci/gpu_next.sh 4   # the paged decode's stall reasons with the page block: ncu with
#                              # --print-details all on packed and paged B64        (~3 min)
#   6. bash ci/gpu_next.sh 6   # host times, their cProfile on the GPU host, transformers_llama
#   Then, with .fa4 carried, python benchmarks/bench.py --decode (docs/bench-decode-h200.*).
# Logs go to $OUT (at most 8 files come back).
set -uo pipefail
PART=${1:?usage: bash ci/gpu_next.sh 1|2|3|4|6|first|host|llama|s49|s50|s52|s53|gidx|g3|d64var|d64ab|swap|odd|even}
OUT=${OUT:-/tmp/portattn-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"
# Golden verify of sm90 in a call of its own, then where the card is an H200 the decode
# benchmark (issue 37 asks docs/bench-decode-h200.* from one run) and the eager host time.
verify_and_h200_decode() {
  step verify 240 python3 -m portattn golden verify --family sm90  # cold: 120 s was too short
  tail -n 2 "$OUT/verify.log"
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    source .fa4/install.sh >"$OUT/fa4_install.log" 2>&1
    step decode 300 python3 benchmarks/bench.py --decode --docs
    cp docs/bench-decode-* "$OUT/"
    grep -E "^\|" "$OUT/decode.log" | head -n 22
    step host 60 python3 benchmarks/host_overhead.py --gpu --n 1000
    grep -E "^\|" "$OUT/host.log"
  fi
}
if [ "$PART" = 1 ]; then
  step gpu_tests 200 python3 -m pytest tests/test_kvcache.py tests/test_kvcache_replay.py \
    tests/test_page_block.py tests/test_append.py tests/test_rollout_gpu.py \
    tests/test_cuda_graphs.py tests/test_host_caches.py tests/test_launcher.py \
    tests/test_forward_replay.py tests/test_direct_calls.py -n 8 -p no:cacheprovider \
    -W ignore::DeprecationWarning -rfE -q
  tail -n 3 "$OUT/gpu_tests.log"
  step golden 300 python3 -m portattn golden verify --family sm90
  tail -n 2 "$OUT/golden.log"
  step paged 60 python3 ci/decode_paged_ab.py --kernel varlen --kernel fixed_order
  grep -E "^\|" "$OUT/paged.log"
elif [ "$PART" = 2 ]; then
  step repair_main 120 python3 ci/bench_repair.py --tokens skewed16k,8x2048 --head-dims 64,128 \
    --passes 2
  grep -E "^\|" "$OUT/repair_main.log"
  patch -p1 <ci/patches/repair_four_warps.diff >/dev/null && echo "patch applied"
  step repair_tests 150 python3 -m pytest tests/test_unseen_keys.py tests/test_plan.py -n 8 \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  tail -n 3 "$OUT/repair_tests.log"
  step repair_4w 120 python3 ci/bench_repair.py --tokens skewed16k,8x2048 --head-dims 64,128 \
    --passes 2
  grep -E "^\|" "$OUT/repair_4w.log"
  patch -R -p1 <ci/patches/repair_four_warps.diff >/dev/null && echo "patch reverted"
elif [ "$PART" = 3 ]; then
  # -v: a run cut by its limit still names its failures (session 23 lost one that way)
  # shellcheck disable=SC2046
  step pytest "${PYTEST_LIMIT:-520}" python3 -m pytest $(ls tests/test_[a-h]*.py) -v -n 15 \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE
  grep -E "FAILED|ERROR|passed|failed" "$OUT/pytest.log" | grep -v PASSED | tail -n 15
elif [ "$PART" = odd ] || [ "$PART" = even ]; then
  # the whole GPU suite in two halves (session 47's first two calls): odd / even test files
  rem=$([ "$PART" = odd ] && echo 1 || echo 0)
  # shellcheck disable=SC2046
  step "suite_$PART" "${PYTEST_LIMIT:-560}" python3 -m pytest $(ls tests/test_*.py | \
    awk -v r="$rem" 'NR % 2 == r') -v -n 12 -p no:cacheprovider -W ignore::DeprecationWarning -rfE
  grep -E "FAILED|ERROR|passed|failed" "$OUT/suite_$PART.log" | grep -v PASSED | tail -n 15
elif [ "$PART" = 6 ]; then
  # host time per eager call with the direct launches, and where it goes on the GPU host
  # (paged_append_i: an int cache_seqlens read 181 us against 113 with a tensor on session 30's
  # host, equal on the CPU with launches stubbed: a GPU-side launch cost to find)
  step host 150 python3 benchmarks/host_overhead.py --gpu --n 1000
  grep -E "^\|" "$OUT/host.log"
  step host_prof 90 python3 benchmarks/host_overhead.py --gpu --n 500 --cases paged,paged_append_i,varlen_nograd \
    --profile --sort tottime
  step llama 200 python3 benchmarks/transformers_llama.py
  grep -E "^\|" "$OUT/llama.log" | tail -n 12
elif [ "$PART" = first ]; then
  # session 47's first call (carry .fa4): 34fa539's constexpr record on the GPU (golden), the
  # Gluon decode's bits and TB/s against the shipped decode, the Gluon forward's per-tile time
  source .fa4/install.sh >"$OUT/fa4_install.log" 2>&1
  step golden 240 python3 -m portattn golden verify --family sm90
  tail -n 2 "$OUT/golden.log"
  step gluon_quick 150 python3 ci/gluon_decode_ab.py --quick
  grep -E "^\||Error|error" "$OUT/gluon_quick.log" | head -n 30
  step ceiling 90 python3 ci/decode_ceiling_probe.py
  grep -E "^\|" "$OUT/ceiling.log"
  step gluon 200 python3 ci/gluon_decode_ab.py
  grep -E "^\|" "$OUT/gluon.log" | tail -n +19
elif [ "$PART" = s49 ]; then
  # session 49's first call (refused starts had left 708 device-s): the GPU tests of the kept
  # and direct launches with the kept maps, a host A/B of KEPT_MAPS (alternating), the Gluon
  # split's bits (tests/test_decode_ws.py -k split), then ci/llama_decode_profile.py (d128)
  step tests 170 python3 -m pytest tests/test_kvcache_replay.py tests/test_direct_calls.py \
    tests/test_forward_replay.py tests/test_kept_maps.py tests/test_launcher.py -n 8 \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  tail -n 3 "$OUT/tests.log"
  cases=paged,dense,attention_decode,paged_append_t,varlen_nograd
  for i in 1 2; do
    step host_on$i 50 python3 benchmarks/host_overhead.py --gpu --n 300 --cases $cases
    step host_off$i 50 python3 benchmarks/host_overhead.py --gpu --n 300 --cases $cases \
      --no-kept-maps
  done
  for f in host_on1 host_off1 host_on2 host_off2; do echo "$f"; grep -E "^\| [a-z]" "$OUT/$f.log"; done
  step split 120 python3 -m pytest tests/test_decode_ws.py -k split -n 8 -p no:cacheprovider \
    -W ignore::DeprecationWarning -rfE -q
  tail -n 3 "$OUT/split.log"
  step llama_prof 150 python3 ci/llama_decode_profile.py
  head -n 4 "$OUT/llama_prof.log"
elif [ "$PART" = s50 ]; then
  # session 50's second call (carry .fa4): golden verify of sm90 in a call of its own (its
  # refresh with the Gluon split on ran in the first), the decode benchmark where the card is
  # an H200 (issue 37 asks docs/bench-decode-h200.* from one run), then the GPU tests of
  # decode == prefill, rollout and replay in the time left
  t0=$(date +%s)
  verify_and_h200_decode
  left=$(( 570 - $(date +%s) + t0 ))
  step tests "$left" python3 -m pytest tests/test_invariance_gpu.py tests/test_rollout_gpu.py \
    tests/test_kvcache_replay.py tests/test_page_block.py tests/test_append.py -n 12 \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  tail -n 4 "$OUT/tests.log"
elif [ "$PART" = s53 ]; then
  # session 53's first call (carry .fa4): golden verify of sm90, then on an H200 the decode
  # table with the swapped decode on (issue 37: docs/bench-decode-h200.* from one run; the
  # last was session 46's) and the eager host time; the GPU suite follows in `odd` / `even`
  verify_and_h200_decode
elif [ "$PART" = gidx ]; then
  # session 53's captured index tensors (perf-notes row 132): a captured decode step with the
  # old and the new index kernels (bits, µs per step), then the GPU tests of captured and
  # replayed kvcache calls
  step gidx 120 python3 ci/graph_index_ab.py --layers 8 --rounds 3
  grep -E "^\|" "$OUT/gidx.log"
  step gidx_tests 300 python3 -m pytest tests/test_cuda_graphs.py tests/test_kvcache_replay.py \
    tests/test_rollout_gpu.py tests/test_graph_indices.py -n 12 -p no:cacheprovider \
    -W ignore::DeprecationWarning -rfE -q
  tail -n 3 "$OUT/gidx_tests.log"
elif [ "$PART" = s52 ]; then
  # session 52's second call, right after swap_ship (carry .fa4): golden verify of sm90 in a
  # call of its own, the d64 forward in three consumer groups (tune_sm90's round
  # d64-three-groups: bits column and TF/s against the table; perf-notes row 129) and its GPU
  # bits tests, then on an H200 the decode table and host time in the time left
  t0=$(date +%s)
  step verify 240 python3 -m portattn golden verify --family sm90
  tail -n 2 "$OUT/verify.log"
  step d64g3 200 python3 ci/tune_sm90.py --round d64-three-groups --json "$OUT/d64g3.json"
  grep -E "^\|" "$OUT/d64g3.log"
  step g3tests 120 python3 -m pytest tests/test_ws_variants.py -k "fwd_ws" -n 8 \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  tail -n 3 "$OUT/g3tests.log"
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    left=$(( 560 - $(date +%s) + t0 ))
    source .fa4/install.sh >"$OUT/fa4_install.log" 2>&1
    step decode "$left" python3 benchmarks/bench.py --decode --docs
    cp docs/bench-decode-* "$OUT/"
    grep -E "^\|" "$OUT/decode.log" | head -n 22
  fi
elif [ "$PART" = g3 ]; then
  # the three-group d64 forward with each causal group's own key tiles: the round again and
  # the bits tests (perf-notes row 129); first the verify of sm90 with the swapped decode on
  # (its refresh ran in session 52's swap_ship call)
  step verify 240 python3 -m portattn golden verify --family sm90
  tail -n 2 "$OUT/verify.log"
  step d64g3 200 python3 ci/tune_sm90.py --round d64-three-groups --json "$OUT/d64g3.json"
  grep -E "^\|" "$OUT/d64g3.log"
  step g3tests 150 python3 -m pytest tests/test_decode_ws.py \
    tests/test_ws_variants.py::test_fwd_ws_same_bits_as_triton_gpu \
    tests/test_ws_variants.py::test_fwd_ws_three_groups_same_bits_as_triton_gpu -n 8 \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  tail -n 3 "$OUT/g3tests.log"
elif [ "$PART" = d64var ]; then
  # the three-group d64 forward as an entry would ship it, in bench.py's own d64 workloads and
  # the d64 decode rows (its decode at 128-key tiles), against the table, alternating
  # processes (carry .fa4; ci/variant_bench.py; perf-notes row 129)
  source .fa4/install.sh >"$OUT/fa4_install.log" 2>&1
  g3=varlen:64:fwd=192/128/12/3,fwd_ws=1
  for round in 1 2; do
    step "table$round" 120 python3 ci/variant_bench.py -- --workloads d64 --impls "portattn varlen" \
      --impls "FA4 det" --json "$OUT/table$round.json"
    step "g3_$round" 120 python3 ci/variant_bench.py --variant "$g3" -- --workloads d64 \
      --impls "portattn varlen" --impls "FA4 det" --json "$OUT/g3_$round.json"
  done
  grep -hE "^\| (equal|skewed)" "$OUT"/table1.log "$OUT"/g3_1.log "$OUT"/table2.log "$OUT"/g3_2.log
  step dec_table 90 python3 ci/variant_bench.py -- --decode --workloads d64
  step dec_g3 90 python3 ci/variant_bench.py --variant "$g3" -- --decode --workloads d64
  grep -hE "^\| decode" "$OUT"/dec_table.log "$OUT"/dec_g3.log
elif [ "$PART" = d64ab ]; then
  # perf-notes row 125: main's d64 training steps against session 43's tree (244bb29), which
  # must be in .old244 first (here: `mkdir .old244 && git archive 244bb29 portattn benchmarks |
  # tar -x -C .old244`; untracked, so it travels with the tree; delete it after). Alternating
  # processes, two rounds: transformers_llama at d64, then bench.py's d64 rows (kernels alone)
  [ -d .old244 ] || { echo ".old244 missing"; exit 2; }
  for tree in "$PWD" "$PWD/.old244"; do
    sed 's/for head_dim in (64, 128)/for head_dim in (64,)/' "$tree/benchmarks/transformers_llama.py" \
      >"$tree/tl64.py"  # the package and benchmarks/ from PYTHONPATH
  done
  # main with the kept TMA maps off (session 49's launcher.KEPT_MAPS: the one launch-path change
  # since 244bb29 that every training launch with host descriptors takes)
  nomaps="import runpy, portattn.kernels.launcher as l; l.KEPT_MAPS = False; \
runpy.run_path('tl64.py', run_name='__main__')"
  for round in 1 2; do
    for tree in "$PWD" "$PWD/.old244"; do
      name=$([ "$tree" = "$PWD" ] && echo main || echo old)$round
      (cd "$tree" && PYTHONPATH=$tree step "$name" 80 python3 tl64.py)
      echo "== $name"; grep -E "^d64" "$OUT/$name.log"
    done
    step "nomaps$round" 80 python3 -c "$nomaps"
    echo "== nomaps$round"; grep -E "^d64" "$OUT/nomaps$round.log"
  done
  for tree in "$PWD" "$PWD/.old244"; do
    name=$([ "$tree" = "$PWD" ] && echo main || echo old)_kernels
    (cd "$tree" && PYTHONPATH=$tree step "$name" 150 python3 benchmarks/bench.py --workloads "2x8192 h16 d64" --impls "portattn varlen" --passes 2)
    echo "== $name"; grep -E "d64" "$OUT/$name.log" | head -n 8
  done
elif [ "$PART" = swap ]; then
  # session 51: the swapped Gluon decode (portattn/kernels/decode_swap.py, off in every entry):
  # its out and lse against the shipped decode's, bitwise, and graph TB/s beside the unswapped
  # Gluon decode at the entry's slots (varlen; packed and pages of 16 / 64)
  step swap_ab "${SWAP_LIMIT:-330}" python3 ci/gluon_decode_ab.py --swap
  grep -E "^\||rror" "$OUT/swap_ab.log" | head -n 40
  step swap_tests 150 python3 -m pytest tests/test_decode_ws.py -k swapped -n 8 \
    -p no:cacheprovider -W ignore::DeprecationWarning -rfE -q
  tail -n 4 "$OUT/swap_tests.log"
elif [ "$PART" = llama ]; then
  step llama_prof 240 python3 ci/llama_decode_profile.py
  head -n 4 "$OUT/llama_prof.log"
  step llama_prof64 200 python3 ci/llama_decode_profile.py --head-dim 64
  head -n 4 "$OUT/llama_prof64.log"
elif [ "$PART" = host ]; then
  step host 150 python3 benchmarks/host_overhead.py --gpu --n 1000
  grep -E "^\|" "$OUT/host.log"
  step host_prof 90 python3 benchmarks/host_overhead.py --gpu --n 500 --cases paged,paged_append_i,attention_decode \
    --profile --sort tottime
elif [ "$PART" = 4 ]; then
  step paged_ncu 240 ncu --clock-control none --kernel-name regex:attn_decode_kernel -c 2 \
    --section WarpStateStats --section SourceCounters --print-details all \
    python3 ci/decode_paged_ab.py --ncu --workloads "decode B64"
  grep -iE "attn_decode_kernel|stall|Warp Cycles" "$OUT/paged_ncu.log" | head -n 80
fi
printf '%s\n' "${summary[@]}"
