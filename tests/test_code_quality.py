"""Code quality the reviewers hold every module of ``pyloader/`` to, checked as the code changes."""
from __future__ import annotations

from pathlib import Path
from typing import List

import pytest
from radon.complexity import add_inner_blocks, cc_visit
from radon.visitors import Function

PACKAGE = Path(__file__).resolve().parent.parent / "pyloader"
MAX_COMPLEXITY = 15


def too_complex(source: str, limit: int = MAX_COMPLEXITY) -> List[str]:
    """The functions of ``source`` (methods and closures included) whose cyclomatic complexity is
    above ``limit``, as ``name (line n): complexity c``, in line order. Classes are not counted
    themselves: radon's complexity of a class is the mean of its methods' plus one."""
    blocks = sorted((b for b in add_inner_blocks(cc_visit(source)) if isinstance(b, Function)),
                    key=lambda b: b.lineno)
    return [f"{b.fullname} (line {b.lineno}): complexity {b.complexity}" for b in blocks if b.complexity > limit]


@pytest.mark.timeout(120)
def test_no_function_in_pyloader_has_a_cyclomatic_complexity_above_15():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 40, f"pyloader's modules not found under {PACKAGE}"
    found = [f"{path.relative_to(PACKAGE.parent)}: {block}"
             for path in modules for block in too_complex(path.read_text(encoding="utf-8"))]
    assert found == [], "split these into smaller functions (radon cc -s -n D pyloader/):\n" + "\n".join(found)


def test_the_complexity_check_finds_a_function_above_the_limit():
    branches = "".join(f"        if x == {i}:\n            return {i}\n" for i in range(15))  # 15 decisions: 16
    source = f"def flat(x):\n    return x\n\n\nclass C:\n    def branchy(self, x):\n{branches}        return -1\n"
    assert too_complex(source) == ["C.branchy (line 6): complexity 16"]
    assert too_complex(source, limit=16) == []
