"""Every wrong proof in tests/unsound/ is refused at the expected step with the expected message.

Each file states its expectation in its header: ``# expect: TEXT`` (a substring of the
refusal) and ``# step: N`` (1-based; 0 when the file is refused before any step runs,
e.g. for a malformed lemma); ``# strict: yes`` when it is refused by ``napkin check
--strict`` (a wrong lemma that bounded testing lets through, which strict refuses because
it is not proved).  The suite fails if any of them is accepted.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from napkin_cat.diagnostics import NapkinError
from napkin_cat.proof import check_file

CORPUS = Path(__file__).with_name("unsound")
FILES = sorted(CORPUS.glob("*.ncd"))


def _header(path: Path) -> tuple[str, int, bool]:
    text = path.read_text(encoding="utf-8")
    expect = re.search(r"^# expect: (.+)$", text, re.M)
    step = re.search(r"^# step: (\d+)$", text, re.M)
    assert expect and step, f"{path.name} lacks its `# expect:` / `# step:` header"
    return expect.group(1).strip(), int(step.group(1)), re.search(r"^# strict: yes$", text, re.M) is not None


def test_corpus_is_large_enough() -> None:
    assert len(FILES) >= 140, f"README.md promises over 140 wrong proofs; {CORPUS} has {len(FILES)}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_wrong_proof_is_refused(path: Path) -> None:
    expect, step, strict = _header(path)
    if step == 0:
        with pytest.raises(NapkinError) as info:
            check_file(path, strict=strict)
        assert any(expect in d.message for d in info.value.diagnostics), info.value
        return
    results = check_file(path, strict=strict)
    assert results, "the file has no theorem"
    failed = [r for r in results if not r.ok]
    assert failed, f"{path.name}: every theorem was accepted"
    result = failed[0]
    assert result.failure is not None
    assert result.step == step, f"refused at step {result.step}, expected {step}: {result.failure.message}"
    assert expect in result.failure.message, result.failure.message
    assert result.failure.span is not None and result.failure.span.line > 0
