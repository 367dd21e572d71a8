"""The ahead-of-time compile check (``portattn.tools.compilecheck``).

Compiling needs Triton's compiler, while this test session may run under its interpreter
(``TRITON_INTERPRET=1``, set by conftest on CPU): compiles run in child processes without it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from portattn.configs import HEAD_DIMS, KERNELS
from portattn.families import FAMILIES
from portattn.tools import compilecheck as cc
from portattn.tools.compile_launches import CHUNK_STAGES, WS_KERNELS

# Compiles, Triton APIs or the installed Triton's table: nox -s tests_newest runs it too.
pytestmark = pytest.mark.triton_version

ROOT = Path(__file__).resolve().parents[1]


def run_python(argv: list[str], extra_env: dict[str, str] | None = None):
    """``python *argv`` in a fresh process without TRITON_INTERPRET (with ``extra_env``), this
    checkout first on its path; asserts it exits 0 and returns the completed process."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | (extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def run_child(code: str, extra_env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in a fresh Python without TRITON_INTERPRET (with ``extra_env``); it prints
    one JSON line last."""
    proc = run_python(["-c", textwrap.dedent(code)], extra_env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- compiling


@pytest.fixture(scope="module")
def twice() -> dict:
    """sm90 forward and cdna3 dQ at d=64, each compiled twice; plus the JIT's specialisation."""
    return run_child(
        """
        import json
        from triton.compiler.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature
        from portattn.tools import compilecheck as cc
        from portattn.tools.compile_inputs import specialize
        from portattn.families import FAMILIES

        out = {}
        for fam, kernel, stage in [("sm90", "varlen", "fwd"), ("cdna3", "fixed_order", "bwd_dq")]:
            entry = cc.Entry(fam, kernel, 64, "bf16")
            runs = [cc.check_entry(entry, stages=[stage])[0].record() for _ in range(2)]
            launch = cc.record_launches(entry)[stage][0]
            backend = make_backend(FAMILIES[fam].target())
            binder = create_function_from_signature(launch.fn.signature, launch.fn.params, backend)
            spec = binder(**launch.args)[1]
            jit_sig = {p.name: s[0] for p, s in zip(launch.fn.params, spec)}
            jit_attrs = {str((i,)): backend.parse_attr(s[1]) for i, s in enumerate(spec)
                         if isinstance(s[1], str)}
            sig, _, attrs = specialize(launch, backend)
            out[fam] = {"runs": runs, "same_signature": sig == jit_sig,
                        "same_attrs": {str(k): v for k, v in attrs.items()} == jit_attrs,
                        "divisibility": sum(["tt.divisibility", 16] in v for v in attrs.values())}
        print(json.dumps(out))
        """
    )


@pytest.mark.parametrize("fam", ["sm90", "cdna3"])
def test_compile_passes_checks(twice, fam):
    first, second = twice[fam]["runs"]
    assert first["ok"], first["failures"]
    assert first["spills"] == 0 and first["scratch"] == 0
    assert first["mma"] > 0
    assert 0 < first["shared"] <= FAMILIES[fam].shared_mem_bytes
    assert first["regs"] > 0
    assert len(first["fingerprint"]) == 64


@pytest.mark.parametrize("fam", ["sm90", "cdna3"])
def test_fingerprint_is_reproducible(twice, fam):
    first, second = twice[fam]["runs"]
    assert first["fingerprint"] == second["fingerprint"]
    assert first == second


# Settings that change Triton's code when set in the environment (each one changes the sm90
# or cdna3 kernels of `twice` when nothing pins it: spills, mma.sync instead of wgmma, ...).
HOSTILE_ENV = {
    "DISABLE_MMA_V3": "1",
    "DISABLE_LLVM_OPT": "1",
    "TRITON_DEFAULT_FP_FUSION": "0",
    "TRITON_F32_DEFAULT": "ieee",
    "PTXAS_OPTIONS": "--maxrregcount=64",
    "AMDGCN_USE_BUFFER_OPS": "0",
    "TRITON_HIP_USE_BLOCK_PINGPONG": "1",
    "TRITON_HIP_USE_ASYNC_COPY": "1",
}


def bundled_ptxas() -> str:
    """The CUDA 12 ptxas bundled with the installed Triton: Triton 3.9 assembles with its other
    one (ptxas-blackwell, CUDA 13) unless $TRITON_PTXAS_BLACKWELL_PATH names another."""
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas")


def test_fingerprint_ignores_the_environment(twice):
    """The knobs are pinned: CPU CI and a GPU machine with other Triton variables set compile
    the same machine code (the golden files' fingerprints), and the environment comes back."""
    env = HOSTILE_ENV | {"TRITON_PTXAS_BLACKWELL_PATH": bundled_ptxas()}
    hostile = run_child(
        """
        import json, os
        from portattn.tools import compilecheck as cc
        out = {}
        for fam, kernel, stage in [("sm90", "varlen", "fwd"), ("cdna3", "fixed_order", "bwd_dq")]:
            out[fam] = cc.check_entry(cc.Entry(fam, kernel, 64, "bf16"), stages=[stage])[0].record()
        out["env"] = {k: os.environ.get(k) for k in ("DISABLE_MMA_V3", "PTXAS_OPTIONS")}
        print(json.dumps(out))
        """,
        env,
    )
    for fam in ("sm90", "cdna3"):
        assert hostile[fam] == twice[fam]["runs"][0]
    assert hostile["env"] == {k: HOSTILE_ENV[k] for k in ("DISABLE_MMA_V3", "PTXAS_OPTIONS")}


@pytest.mark.parametrize("fam", ["sm90", "cdna3"])
def test_specialisation_matches_the_jit(twice, fam):
    assert twice[fam]["same_signature"]
    assert twice[fam]["same_attrs"]
    assert twice[fam]["divisibility"] > 0  # aligned pointers and strides


@pytest.fixture(scope="module")
def broken() -> dict:
    """Cases each check must catch."""
    return run_child(
        """
        import dataclasses, json
        from portattn.tools import compilecheck as cc
        from portattn.configs import Tiles
        from portattn.families import FAMILIES

        def failures(fam, kernel, d, stage, family=None, **tiles):
            entry = cc.Entry(fam, kernel, d, "bf16")
            cfg = dataclasses.replace(entry.config(), **tiles) if tiles else None
            return cc.check_entry(entry, family=family, cfg=cfg, stages=[stage])[0].failures

        amd = dict(matrix_instr_nonkdim=16, kpack=1)
        out = {
            "tiny_shared": failures("sm90", "varlen", 64, "fwd",
                                    dataclasses.replace(FAMILIES["sm90"], shared_mem_bytes=1024)),
            "missing_instr": failures("sm80", "varlen", 64, "fwd",
                                      dataclasses.replace(FAMILIES["sm80"],
                                                          matrix_instruction="wgmma")),
            "cuda_spills": failures("sm80", "fixed_order", 128, "fwd", fwd=Tiles(128, 64, 4, 2)),
            "amd_spills": failures("cdna3", "fixed_order", 128, "fwd",
                                   fwd=Tiles(128, 64, 4, 1, waves_per_eu=2, **amd)),
            "amd_knob_on_cuda": failures("sm90", "varlen", 64, "bwd_dq",
                                         bwd_dq=Tiles(128, 64, 8, 2, waves_per_eu=2)),
            # BLOCK_N 8 is below tl.dot's minimum: Triton's own error, not its "^" excerpt line
            "compile_error": failures("sm80", "varlen", 64, "fwd", fwd=Tiles(64, 8, 4, 2)),
        }
        print(json.dumps(out))
        """
    )


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("tiny_shared", "shared memory"),
        ("missing_instr", "no wgmma instruction"),
        ("cuda_spills", "register spills"),
        ("amd_spills", "register spills"),
        ("amd_knob_on_cuda", "not cuda options"),
        ("compile_error", "compile failed: attn_fwd_kernel (sm80 varlen/d64/bf16): Assertion"),
    ],
)
def test_check_fails_on_broken_case(broken, case, message):
    assert any(message in failure for failure in broken[case]), broken[case]


def test_compile_failure_names_the_cause(broken):
    (failure,) = broken["compile_error"]
    assert "N >= 1 and K >= 16" in failure  # tl.dot's message
    assert "(at mma line" in failure and "tl.dot(" in failure  # where in the kernel source
    assert not failure.rstrip().endswith("^")


def _compilation_error(src: str, line: int, message: str | None) -> Exception:
    """Triton's CompilationError at ``line`` of the function ``src`` (as its code generator
    raises it: the node of the failing statement)."""
    import ast

    from triton.compiler.errors import CompilationError

    node = next(n for n in ast.walk(ast.parse(src)) if getattr(n, "lineno", None) == line)
    return CompilationError(src, node, message)


OUTER_SRC = "def attn_fwd_ws_kernel(q, k):\n    x = 1\n    gl.warp_specialize([(_producer, ())])\n"
INNER_SRC = "def _producer(desc):\n    n = 2\n    tma.async_copy_global_to_shared(desc, [0, 0])\n"


def test_error_summary_reads_through_the_wrapping():
    """Triton 3.9's failure of the warp-specialised kernels: the outer errors end in a caret
    line (the issue's "CompilationError: ^"), the cause is two levels down."""
    cause = RuntimeError("async_copy_global_to_shared has been removed; call async_load instead")
    inner = _compilation_error(INNER_SRC, 3, str(cause))
    inner.__cause__ = cause
    middle = _compilation_error(OUTER_SRC, 3, None)
    middle.__cause__ = inner
    outer = _compilation_error(OUTER_SRC, 3, str(middle))
    outer.__cause__ = middle
    assert str(middle).strip().splitlines()[-1].strip() == "^"
    assert cc.error_summary(outer) == (
        f"RuntimeError: {cause} (at _producer line 3: "
        "tma.async_copy_global_to_shared(desc, [0, 0]))"
    )


def test_error_summary_keeps_the_first_lines():
    """A compilation error without a cause says it itself; other errors (ptxas' with its log)
    keep their first lines, bounded."""
    own = _compilation_error(INNER_SRC, 2, "unsupported thing\nsecond line")
    assert cc.error_summary(own) == (
        "CompilationError: unsupported thing | second line (at _producer line 2: n = 2)"
    )
    log = "PTXAS error: Internal Triton PTX codegen error\n`ptxas` stderr:\nptxas fatal: x\n"
    summary = cc.error_summary(RuntimeError(log + "Repro command: ptxas ...\n" + "y" * 900))
    assert summary == (
        "RuntimeError: PTXAS error: Internal Triton PTX codegen error | "
        "`ptxas` stderr: | ptxas fatal: x"
    )
    assert len(cc.error_summary(ValueError("z" * 900))) == cc.ERROR_CHARS


def test_cli_json_and_the_key_checks_compile(tmp_path):
    """``python -m portattn compile`` for one entry, and the key check's compile of that guarded
    entry (``ci.golden_dev.key_check.compile_entries``, from this process, which may be
    interpreted: it then compiles in a child) agree bit for bit: the same configuration for
    every stage, the same records (machine code, resources, checks) for golden/'s stages;
    neither has a compile key (those are ci/golden_dev/keys.py's, recorded beside). Not the
    repair passes' machine code: Triton 3.9's AMD backend orders a few integer instructions of
    cdna2's ``fwd_repair`` differently in about one process of six (compile_launches)."""
    from ci.golden_dev.key_check import compile_entries

    path = tmp_path / "cc.json"
    argv = ["--family", "cdna2", "--kernel", "varlen", "--head-dim", "32", "--dtype", "bf16"]
    proc = run_python(["-m", "portattn", "compile", *argv, "--json", str(path), "-j", "1"])
    assert "cdna2" in proc.stdout and "0 failed" in proc.stdout
    data = json.loads(path.read_text())
    records = data["cdna2"]["varlen/d32/bf16"]
    assert set(records) == set(cc.CHECKED_STAGES) - set(CHUNK_STAGES)  # repairs too (§3.2)
    for rec in records.values():
        assert rec["ok"] and len(rec["fingerprint"]) == 64
        assert rec["config_hash"] == records["fwd"]["config_hash"]
    made = compile_entries("cdna2", ["varlen/d32/bf16"])
    assert set(made) == {"varlen/d32/bf16"} and set(made["varlen/d32/bf16"]) == set(cc.STAGES)
    assert not any("key" in r for r in [*records.values(), *made["varlen/d32/bf16"].values()])
    assert made["varlen/d32/bf16"] == {s: records[s] for s in cc.STAGES}


# ----------------------------------------------------------------------------- no compiling


def _args(**overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cc.add_arguments(parser)
    args = parser.parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_refuses_to_run_under_the_interpreter(monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert cc.main(_args()) == 2
    assert "TRITON_INTERPRET" in capsys.readouterr().out


def test_entry_selection():
    assert len(cc.select_entries()) == len(FAMILIES) * len(KERNELS) * len(HEAD_DIMS) * 2
    ci = cc._entries_from_args(_args(subset="ci"))
    assert {e.family for e in ci} == set(FAMILIES)
    assert {e.kernel for e in ci} == set(KERNELS)
    assert {e.head_dim for e in ci} == {64, 80, 128}  # 80: a borrowed head dim
    assert {e.dtype for e in ci} == {"bf16"}
    assert len(ci) == len(FAMILIES) * len(KERNELS) * 3
    borrowed = cc.select_entries(["sm90"], ["varlen"], [80], ["bf16"])
    assert (
        borrowed[0].config() == cc.select_entries(["sm90"], ["varlen"], [96], ["bf16"])[0].config()
    )
    assert cc.select_entries(["sm80"], ["varlen"], [96], ["float16"]) == [
        cc.Entry("sm80", "varlen", 96, "fp16")
    ]
    with pytest.raises(ValueError):
        cc.select_entries(["sm70"])


def test_value_head_dim_entries():
    """``--head-dim 192 --head-dim-v 128`` (MLA): entries of the d256 row whose recorded
    launches give the kernels v's own width; an invalid pair is a ValueError."""
    mla = cc._entries_from_args(_args(family=["sm90"], head_dim=[192], head_dim_v=128))
    assert {(e.head_dim, e.head_dim_v) for e in mla} == {(192, 128)}
    assert all("/d192v128/" in e.label for e in mla) and len(mla) == 4  # 2 kernels x 2 dtypes
    assert mla[0].config() == cc.select_entries(["sm90"], [mla[0].kernel], [256])[0].config()
    launches = cc.record_launches(mla[0])
    fwd, dq = launches["fwd"][0].args, launches["bwd_dq"][0].args
    assert (fwd["HEAD_DIM"], fwd["BLOCK_D"], fwd["HEAD_DIM_V"], fwd["BLOCK_DV"]) == (
        192,
        256,
        128,
        128,
    )
    assert (dq["HEAD_DIM_V"], launches["bwd_pre"][0].args["HEAD_DIM"]) == (128, 128)
    assert launches["decode"][0].args["HEAD_DIM_V"] == 128
    # sm90 varlen d128 selects the Gluon kernels; with v's own head dim the plan runs the
    # Triton ones at the entry's tiles (plan.gluon_applies), never the Gluon ones
    names = {
        dv: {
            ln.fn.__name__
            for ls in cc.record_launches(cc.Entry("sm90", "varlen", 128, "bf16", dv)).values()
            for ln in ls
        }
        for dv in (0, 64)
    }
    assert set(WS_KERNELS) & names[0] and not set(WS_KERNELS) & names[64]
    with pytest.raises(ValueError, match=r"v head dim must equal q's \(192\)"):
        cc.select_entries(["sm90"], ["varlen"], [192], ["bf16"], head_dim_v=64)
    with pytest.raises(ValueError, match="--head-dim-v needs --head-dim"):
        cc._entries_from_args(_args(head_dim_v=128))


def test_sm90_dq_ws_compiles():
    """The warp-specialised dQ kernel (``dq_ws``, selected by the sm90 d128 entries) compiles
    for sm90 from the launcher's own launch at varlen d128 and fixed_order d128 (split-P)
    tiles: no spills, shared memory within the limit, wgmma present."""
    out = run_child(
        """
        import json
        from portattn.tools import compilecheck as cc
        rows = []
        for kernel in ("varlen", "fixed_order"):
            entry = cc.Entry("sm90", kernel, 128, "bf16")
            cfg = entry.config()
            assert cfg.dq_ws, entry
            launch, = cc.record_launches(entry, cfg)["bwd_dq"]
            for r in cc.check_entry(entry, cfg=cfg, stages=["bwd_dq"]):
                rows.append([launch.fn.__name__, r.ok, r.failures, r.spills, r.mma])
        print(json.dumps(rows))
        """
    )
    assert len(out) == 2
    for name, ok, failures, spills, mma in out:
        assert name == "attn_bwd_dq_ws_kernel"
        assert ok, failures
        assert spills == 0 and mma


def test_an_entry_with_a_key_chunk_checks_its_chunk_merge():
    """With a key chunk C (design §3.1) the representative call has at most C keys a sequence
    and runs the kernels without the chunk merge (the forward and decode of an entry without
    C); calls of 2 C keys add the chunk merge's launches (``CHUNK_STAGES``: the forward's and
    the unsplit decode's chunk loops, the split decode's partials and combine), each with the
    entry's tiles, compiled and checked; an entry without a chunk launches none of them."""
    out = run_child(
        """
        import dataclasses, json
        from portattn.tools import compilecheck as cc
        from portattn.tools.compile_launches import CHUNK_STAGES, entry_stages
        entry = cc.Entry("sm90", "varlen", 64, "bf16")
        base = dataclasses.replace(entry.config(), key_chunk=0)  # the entry without a chunk
        cfg = dataclasses.replace(base, key_chunk=2 * base.decode_tiles().block_n)
        launches = cc.record_launches(entry, cfg)
        stages = ["fwd", "decode", *CHUNK_STAGES]
        flags = {s: [launches[s][0].args.get(n) for n in ("SPLIT", "KEY_CHUNK")] for s in stages}
        mismatches = [m for s in stages for m in cc.table_mismatches(launches[s][0], cfg)]
        rows = [[r.stage, r.ok, r.failures, r.spills, r.mma]
                for r in cc.check_entry(entry, cfg=cfg, stages=stages)]
        plain = [list(entry_stages(base, stages)), sorted(cc.record_launches(entry, base))]
        print(json.dumps([flags, mismatches, rows, plain, cfg.key_chunk]))
        """
    )
    flags, mismatches, rows, (plain_stages, plain_launched), chunk = out
    assert flags == {
        "fwd": [None, 0],  # the kernels' defaults: no chunk loop
        "decode": [0, 0],
        "fwd_chunked": [None, chunk],
        "decode_chunked": [0, chunk],
        "decode_split": [1, chunk],
        "decode_combine": [2, chunk],
    }
    assert mismatches == []
    assert [r[0] for r in rows] == ["fwd", "decode", *CHUNK_STAGES]
    for stage, ok, failures, spills, mma in rows:
        assert ok, (stage, failures)
        assert spills == 0 and (mma is None) == (stage == "decode_combine"), stage
    assert plain_stages == ["fwd", "decode"] and not set(CHUNK_STAGES) & set(plain_launched)


def test_sm90_varlen_wgmma_not_serialized():
    """ptxas serializes every wgmma of a kernel (C7515) when non-wgmma code writes the
    accumulators of one in flight. It did so in dK/dV while dV and dK were two branches of one
    kernel (their merged loop exits); they are separate launches now. The benchmarked kernels
    (varlen d128 and d64) must stay free of it; so must a kernel that never had it."""
    out = run_child(
        """
        import json
        from portattn.tools import compilecheck as cc
        rows = []
        for d in (128, 64):
            entry = cc.Entry("sm90", "varlen", d, "bf16")
            for r in cc.check_entry(entry, stages=["fwd", "bwd_dkdv", "bwd_dq"]):
                rows.append([d, r.stage, r.ok, r.wgmma_serialized])
        print(json.dumps(rows))
        """
    )
    assert len(out) == 6
    for head_dim, stage, ok, serialized in out:
        assert ok, (head_dim, stage)
        assert serialized is False, (head_dim, stage)


@pytest.mark.parametrize("where", ["missing-folder", "a-folder"])
def test_json_path_checked_before_compiling(monkeypatch, capsys, tmp_path, where):
    """``compile --json PATH`` into a folder that does not exist (or onto a folder) is refused
    before anything compiles: it died after the whole compile."""
    monkeypatch.setattr(cc, "interpreter_active", lambda: False)
    monkeypatch.setattr(cc, "run_entries", lambda *a, **k: pytest.fail("compiled"))
    path = tmp_path / "no" / "cc.json" if where == "missing-folder" else tmp_path
    args = _args(json=str(path), family=["cdna2"], kernel=["varlen"], head_dim=[32])
    assert cc.main(args) == 2
    assert "nothing compiled" in capsys.readouterr().out
