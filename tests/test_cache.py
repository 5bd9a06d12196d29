"""napkin's cache folder (``napkin_cat.cache``) and the certificates certify stores in it.

A stored certificate is read back instead of certifying again; a changed lemma or box
(its content, not its place in a file) is a new key; an entry that is corrupted, truncated,
copied under another key or of the wrong shape is ignored and certified again.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from napkin_cat import cache, certify
from napkin_cat.certify import rules, tiers
from napkin_cat.certify.catalogue import entries
from napkin_cat.diagnostics import Span
from napkin_cat.ops import typed_box
from napkin_cat.terms import Var


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "cache"
    monkeypatch.setenv("NAPKIN_CACHE_DIR", str(where))
    return where


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Certification replaced by a recorder (the real one is certify's tests' business): each
    computed certificate is logged, so a read from disk is one that logs nothing."""
    log: list[str] = []

    def lemma(lemma: object, level: str) -> certify.Certificate:
        log.append(f"lemma {lemma.name} {level}")  # type: ignore[attr-defined]
        return certify.Certificate(False, "sympy", f"counterexample {len(log)}")

    def accumulator(box: object, axis: str, name: str, pad: bool) -> str:
        log.append(f"accumulator {name} {pad}")
        return f"tested: run {len(log)}"

    monkeypatch.setattr(tiers, "lemma_certificate", lemma)
    monkeypatch.setattr(tiers, "accumulator_answer", accumulator)
    return log


def _lemma() -> object:
    return next(iter(rules.library().values()))


def _certify(lemma: object, level: str = "quick") -> certify.Certificate:
    return certify.certify_lemma.__wrapped__(lemma, level)  # type: ignore[no-any-return]  # past the process memo


def test_a_certificate_is_stored_once_and_read_back(folder: Path, calls: list[str]) -> None:
    lemma = _lemma()
    first = _certify(lemma)
    assert calls == [f"lemma {lemma.name} quick"] and len(list(folder.glob("lemma-*.json"))) == 1  # type: ignore[attr-defined]
    assert _certify(lemma) == first and len(calls) == 1
    moved = dataclasses.replace(lemma, span=Span("elsewhere.ncd", 40, 1))  # type: ignore[type-var]
    assert _certify(moved) == first and len(calls) == 1  # where it is written is not what it says
    _certify(lemma, "full")
    assert len(calls) == 2  # another level, another key


def test_a_changed_lemma_or_box_misses_the_cache(folder: Path, calls: list[str]) -> None:
    lemma = _lemma()
    _certify(lemma)
    changed = dataclasses.replace(lemma, rhs=lemma.lhs)  # type: ignore[type-var, attr-defined]
    assert _certify(changed).counterexample == "counterexample 2" and len(calls) == 2
    renamed = dataclasses.replace(lemma, name=lemma.name + "_2")  # type: ignore[type-var, attr-defined]
    _certify(renamed)
    assert len(calls) == 3
    box = typed_box("sum", (Var("X0", ("q", "x")),), ("x",))
    oracle = certify.accumulator.__wrapped__  # type: ignore[attr-defined]
    assert oracle(box, "x", "sum", True) == "tested: run 4"
    assert oracle(box, "x", "sum", True) == "tested: run 4" and len(calls) == 4
    assert oracle(box, "x", "sum", False) == "tested: run 5"  # the padding law is part of the question
    other = typed_box("max", (Var("X0", ("q", "x")),), ("x",))
    assert oracle(other, "x", "max", True) == "tested: run 6"
    woven = typed_box("sum", (Var("S", ("b", "q", "x")),), ("x",))  # the canonical box drops woven axes
    assert oracle(woven, "x", "sum", True) == "tested: run 4" and len(calls) == 6


@pytest.mark.parametrize("damage", ["truncated", "garbage", "verdict flipped", "another key", "wrong shape",
                                    "empty"])
def test_a_damaged_entry_is_ignored_and_certified_again(damage: str, folder: Path, calls: list[str]) -> None:
    lemma = _lemma()
    first = _certify(lemma)
    (path,) = folder.glob("lemma-*.json")
    entry = json.loads(path.read_text())
    if damage == "truncated":
        path.write_text(path.read_text()[: len(path.read_text()) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\xff\xfe not json")
    elif damage == "verdict flipped":  # ok: true without napkin having said so: the digest no longer matches
        entry["payload"]["ok"] = True
        path.write_text(json.dumps(entry))
    elif damage == "another key":  # a valid entry of another lemma copied under this key
        other = dataclasses.replace(lemma, name="other")  # type: ignore[type-var]
        _certify(other)
        (copied,) = [p for p in folder.glob("lemma-*.json") if p != path]
        path.write_text(copied.read_text())
    elif damage == "wrong shape":  # a consistent entry whose payload is not a certificate
        entry["payload"] = {"ok": "yes", "how": 3, "counterexample": None}
        entry["digest"] = cache._digest(entry["key"], entry["payload"])
        path.write_text(json.dumps(entry))
    else:
        path.write_text("")
    before = len(calls)
    again = _certify(lemma)
    assert len(calls) == before + 1 and again.ok is False and again != first  # computed anew (the recorder counts)
    assert _certify(lemma) == again and len(calls) == before + 1  # and stored over the damaged entry


def test_no_cache_folder_means_no_disk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, calls: list[str]) -> None:
    monkeypatch.setenv("NAPKIN_CACHE_DIR", "")
    monkeypatch.chdir(tmp_path)
    lemma = _lemma()
    _certify(lemma)
    _certify(lemma)
    assert len(calls) == 2 and list(tmp_path.iterdir()) == []


def test_a_real_certificate_round_trips(folder: Path) -> None:
    """Without the recorder: the stored certificate of a library lemma equals the computed one."""
    name = next(e.name for e in entries() if e.kind == "lemma")
    lemma = rules.library()[name]
    computed = tiers.lemma_certificate(lemma, "quick")
    assert _certify(lemma) == computed  # stored
    assert _certify(lemma) == computed  # read back
    assert len(list(folder.glob("lemma-*.json"))) == 1


# ---- a verb's outcome, replayed (napkin_cat.verbs.replay) -------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def _matmul(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of proofs/matmul.ncd and the diagram file it uses: (the proof, the used file)."""
    for folder in ("proofs", "examples"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "matmul.ncd").write_text((ROOT / folder / "matmul.ncd").read_text())
    return tmp_path / "proofs" / "matmul.ncd", tmp_path / "examples" / "matmul.ncd"


def _napkin(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from napkin_cat.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cost_pseudo_and_lower_replay_their_outcome(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    proof, used = _matmul(tmp_path)
    kernel = tmp_path / "k.py"
    runs = [("cost", str(proof), "tiled_matmul", "--size", "a=256"), ("pseudo", str(proof), "tiled_matmul"),
            ("lower", str(proof), "tiled_matmul", "--target", "jax", "-o", str(kernel))]
    first = [_napkin(capsys, *argv) for argv in runs]
    assert all(code == 0 for code, _, _ in first), first
    source = kernel.read_text()
    kernel.unlink()
    from napkin_cat.verbs import cost as cost_verbs
    from napkin_cat.verbs import lower as lower_verbs

    ran: list[str] = []
    for module, name in ((cost_verbs, "cmd_cost"), (cost_verbs, "cmd_pseudo"), (lower_verbs, "cmd_lower")):
        monkeypatch.setattr(module, name, lambda args: ran.append(args.verb) or 3)
    assert [_napkin(capsys, *argv) for argv in runs] == first and ran == []  # replayed, byte for byte
    assert kernel.read_text() == source
    assert _napkin(capsys, "cost", str(proof), "tiled_matmul", "--size", "a=512")[0] == 3 and ran == ["cost"]
    used.write_text(used.read_text() + "\n# a comment in the used file changes the key\n")
    assert [_napkin(capsys, *argv)[0] for argv in runs] == [3, 3, 3] and ran == ["cost", "cost", "pseudo", "lower"]


def test_a_use_glued_to_a_number_is_in_the_key(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The lexer reads `axis x = 64use "b.ncd"` as a use (an INT, then the keyword): the replay's key
    must cover b.ncd, or a changed b.ncd replays the kernel of the diagram it no longer holds."""
    used = tmp_path / "b.ncd"
    used.write_text("axis x = 64\ndiagram g(S: [x]) -> [x] {\n  return S * 2\n}\n")
    proof = tmp_path / "a.ncd"
    proof.write_text('axis x = 64use "b.ncd"\ndiagram f(S: [x]) -> [x] {\n  return g(S)\n}\n'
                     "theorem t: f {\n  group x by 16\n}\n")
    assert used.resolve() in cache.closure(proof)
    argv = ("lower", str(proof), "t", "--target", "jax", "-o", str(tmp_path / "k.py"))
    assert _napkin(capsys, *argv)[0] == 0 and "S * 2" in (tmp_path / "k.py").read_text()
    used.write_text(used.read_text().replace("S * 2", "S * 3"))
    assert _napkin(capsys, *argv)[0] == 0 and "S * 3" in (tmp_path / "k.py").read_text()


def test_a_replay_checks_its_outputs_and_a_damaged_outcome_runs_the_verb(
        folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    proof, _ = _matmul(tmp_path)
    target = tmp_path / "k.py"
    argv = ("lower", str(proof), "tiled_matmul", "--target", "jax", "-o", str(target))
    assert _napkin(capsys, *argv)[0] == 0
    target.unlink()
    target.mkdir()  # an output that is a folder: refused by the replay as by the verb
    code, _, err = _napkin(capsys, *argv)
    assert code == 2 and "k.py" in err and target.is_dir()
    target.rmdir()
    (entry,) = folder.glob("verb-lower-*.json")
    entry.write_text(entry.read_text().replace("tiled_matmul", "tiled_matmuk"))
    from napkin_cat.verbs import lower as lower_verbs

    ran: list[str] = []
    monkeypatch.setattr(lower_verbs, "cmd_lower", lambda args: ran.append(args.verb) or 3)
    assert _napkin(capsys, *argv)[0] == 3 and ran == ["lower"]  # the digest no longer matches: not replayed


def test_a_changed_hardware_profile_file_is_a_new_key(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "mine.toml"
    profile.write_text((ROOT / "napkin_cat" / "cost" / "hardware" / "cpu.toml").read_text())
    argv = ("cost", str(ROOT / "proofs" / "matmul.ncd"), "tiled_matmul", "--hardware", str(profile))
    assert _napkin(capsys, *argv)[0] == 0
    from napkin_cat.verbs import cost as cost_verbs

    ran: list[str] = []
    monkeypatch.setattr(cost_verbs, "cmd_cost", lambda args: ran.append(args.verb) or 3)
    assert _napkin(capsys, *argv)[0] == 0 and ran == []
    profile.write_text(profile.read_text() + "\n# another profile\n")
    assert _napkin(capsys, *argv)[0] == 3 and ran == ["cost"]


def test_a_simplified_cost_expression_reads_back_as_simplify_returned_it(folder: Path) -> None:
    import sympy

    from napkin_cat.schedule import program

    q, x = sympy.symbols("q x", positive=True, integer=True)
    expr = (q**2 + 2 * q * x + x**2) / (q + x) + sympy.ceiling(q / 64) * sympy.Max(x, 64)
    want = sympy.simplify(expr)
    assert program.simplified.__wrapped__(expr) == want  # type: ignore[attr-defined]
    (entry,) = folder.glob("simplified-*.json")
    assert program.simplified.__wrapped__(expr) == want  # type: ignore[attr-defined]  # read back
    data = json.loads(entry.read_text())
    data["payload"] = "Add(("  # a consistent entry whose text does not read back: simplified again
    data["digest"] = cache._digest(data["key"], data["payload"])
    entry.write_text(json.dumps(data))
    assert program.simplified.__wrapped__(expr) == want  # type: ignore[attr-defined]


def test_the_cost_model_of_a_search_is_stored_and_read_back_exactly(folder: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``derive.model_cost`` stores each answer (``derive.remembered``): a later search reads it
    back equal, tiles in their order, without pricing the schedule again; another size is a new key,
    and a damaged entry is priced again."""
    from napkin_cat import proof
    from napkin_cat.search import derive

    thm = proof.theorem(str(ROOT / "proofs" / "flash_attention.ncd"), "flash_attention")
    first = derive.model_cost("h100", sizes={"q": 2048, "x": 2048})(thm)
    assert first.fits and first.tiles and list(folder.glob("model_cost-*.json"))

    priced: list[str] = []
    real = derive.cost.cost
    monkeypatch.setattr(derive.cost, "cost", lambda *a, **k: priced.append("cost") or real(*a, **k))
    again = derive.model_cost("h100", sizes={"q": 2048, "x": 2048})(thm)
    assert again == first and list(again.tiles) == list(first.tiles) and priced == []
    other = derive.model_cost("h100", sizes={"q": 4096, "x": 2048})(thm)
    assert priced == ["cost"] and other.summary != first.summary
    for entry in folder.glob("model_cost-*.json"):
        entry.write_text(entry.read_text().replace('"fits": true', '"fits": 1'))
    assert derive.model_cost("h100", sizes={"q": 2048, "x": 2048})(thm) == first and priced == ["cost", "cost"]


def test_an_edited_side_condition_or_used_lemma_is_certified_again_not_read_back(folder: Path,
                                                                                  tmp_path: Path) -> None:
    """Check, edit, check again with the same cache folder and the process memo cleared, so that
    only the disk could answer: a lemma certified under `when c finite` and stored, then stated
    without it (false at c = -inf: softmax of -inf rows), and a used file's lemma edited from
    true to false under the same name, are each certified anew and refused.  (Without --strict:
    the shift's use is only tested there, since `S + c` may drop S whole at c = 1e20.)"""
    from napkin_cat.proof import check_file

    lemmas = tmp_path / "lemmas.ncd"
    proof = tmp_path / "proof.ncd"
    shift = "lemma sh(S: [x], c: []) : softmax[x](S + c) = softmax[x](S) when c finite\n"
    twice = "lemma twice(S: [x]) : sum[x](S + S) = sum[x](S) + sum[x](S)\n"
    lemmas.write_text("axis x\n" + shift + twice)
    proof.write_text('use "lemmas.ncd"\naxis q, x\n'
                     "diagram g(S: [q x], c: []) -> [q x] {\n  return softmax[x](S + c)\n}\n"
                     "diagram h(S: [q x]) -> [q] {\n  return sum[x](S + S)\n}\n"
                     "theorem t: g {\n  rewrite sh at return\n}\ntheorem u: h {\n  rewrite twice at return\n}\n")

    def verdicts() -> list[bool]:
        certify.certify_lemma.cache_clear()  # past the process memo: only the disk remembers
        return [r.ok for r in check_file(proof)]

    assert verdicts() == [True, True] and len(list(folder.glob("lemma-*.json"))) >= 2
    lemmas.write_text("axis x\n" + shift.replace(" when c finite", "") + twice)
    assert verdicts() == [False, True]
    lemmas.write_text("axis x\n" + shift + twice.replace("= sum[x](S) + sum[x](S)", "= sum[x](S)"))
    assert verdicts() == [True, False]


def test_a_use_after_a_quote_in_a_comment_under_cr_line_ends_is_in_the_key(
        folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Lines ended by a lone CR (the parser reads each \\r as a line end): a `"` in a comment pairs, for a
    search that stops only at \\n, with the opening quote of the next line's `use "b.ncd"`, so b.ncd was
    left out of the key and a changed b.ncd replayed the kernel of the diagram it no longer holds."""
    used = tmp_path / "b.ncd"
    used.write_text("axis x = 64\ndiagram g(S: [x]) -> [x] {\n  return S * 2\n}\n")
    proof = tmp_path / "a.ncd"
    proof.write_bytes(b'# a 5" screen\ruse "b.ncd"\rdiagram f(S: [x]) -> [x] {\r  return g(S)\r}\r'
                      b"theorem t: f {\r  group x by 16\r}\r")
    argv = ("lower", str(proof), "t", "--target", "jax", "-o", str(tmp_path / "k.py"))
    assert _napkin(capsys, *argv)[0] == 0 and "S * 2" in (tmp_path / "k.py").read_text()
    used.write_text(used.read_text().replace("S * 2", "S * 3"))
    assert _napkin(capsys, *argv)[0] == 0 and "S * 3" in (tmp_path / "k.py").read_text()
    assert used.resolve() in cache.closure(proof)
