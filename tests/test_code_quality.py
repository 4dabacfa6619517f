"""Code quality the reviewers hold every module of ``pyloader/`` to, checked as the code changes."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import List

import pytest
from radon.complexity import add_inner_blocks, cc_visit, sorted_results
from radon.visitors import Function

PACKAGE = Path(__file__).resolve().parent.parent / "pyloader"
MAX_COMPLEXITY = 15
MAX_POSITIONAL = 6  # arguments given by position in one call; more are named (issue 29)
MAX_ANY_PER_1000_LINES = 12.0  # ``Any`` per 1,000 non-blank lines of pyloader/ (issue 29 asks 20: lower it as it falls)
MAX_MEAN_COMPLEXITY = 2.95  # radon's mean over every block of pyloader/ (issue 29 asks 3.0)


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


def crowded_calls(source: str, limit: int = MAX_POSITIONAL) -> List[str]:
    """The calls of ``source`` that pass more than ``limit`` arguments by position, as ``line n: name``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and len(node.args) > limit:
            found.append(f"line {node.lineno}: {ast.unparse(node.func)}({len(node.args)} positional)")
    return sorted(found, key=lambda line: int(line.split()[1].rstrip(":")))


def any_per_1000_lines(sources: List[str]) -> float:
    """``Any`` (the typing name, as a word) per 1,000 non-blank lines of ``sources``."""
    count = sum(len(re.findall(r"\bAny\b", source)) for source in sources)
    lines = sum(1 for source in sources for line in source.splitlines() if line.strip())
    return 1000 * count / lines


def test_no_call_in_pyloader_passes_more_than_6_arguments_by_position():
    found = [f"{path.relative_to(PACKAGE.parent)}: {call}"
             for path in sorted(PACKAGE.rglob("*.py")) for call in crowded_calls(path.read_text(encoding="utf-8"))]
    assert found == [], "name these arguments (keywords), or group them in a small typed object:\n" + "\n".join(found)


def test_the_positional_check_finds_a_call_with_7_positional_arguments():
    source = "f(1, 2, 3, 4, 5, 6)\ng(1, 2, 3, 4, 5, 6, x=7)\n\n\ndef h():\n    return obj.make(1, 2, 3, 4, 5, 6, 7)\n"
    assert crowded_calls(source) == ["line 6: obj.make(7 positional)"]


def test_pyloader_uses_any_at_most_as_often_as_the_bound_per_1000_lines():
    density = any_per_1000_lines([path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))])
    assert density <= MAX_ANY_PER_1000_LINES, (
        f"pyloader/ has {density:.1f} Any per 1,000 lines (at most {MAX_ANY_PER_1000_LINES}): type what a value is "
        f"(a Protocol, a NamedTuple, object for a value only passed on or checked)")


def test_the_any_density_counts_the_word_per_1000_non_blank_lines():
    sources = ["from typing import Any\n\n\ndef f(x: Any) -> Any:\n    return x\n", "Anything = 1\n"]
    assert any_per_1000_lines(sources) == 1000 * 3 / 4


def mean_complexity(sources: List[str]) -> float:
    """radon's mean cyclomatic complexity over every block of ``sources``, as ``radon cc -a`` reports it:
    classes, functions and methods each count once (a closure is part of its function's block)."""
    blocks = [block for source in sources for block in sorted_results(cc_visit(source))]
    return sum(block.complexity for block in blocks) / len(blocks)


def test_pyloader_s_mean_cyclomatic_complexity_is_at_most_the_bound():
    mean = mean_complexity([path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))])
    assert mean <= MAX_MEAN_COMPLEXITY, (
        f"pyloader/'s mean cyclomatic complexity is {mean:.3f} (at most {MAX_MEAN_COMPLEXITY}; radon cc -a -s "
        f"pyloader): split the branchiest functions into named steps")


def test_the_mean_complexity_averages_over_classes_functions_and_methods_of_every_source():
    branchy = "def f(x):\n    return x\n\n\nclass C:\n    def m(self, x):\n        if x:\n            return 1\n" \
              "        return 2\n"
    assert mean_complexity([branchy]) == (3 + 2 + 1) / 3  # C (its methods' decisions, plus one), C.m, f
    assert mean_complexity([branchy, "def g():\n    return 1\n"]) == (3 + 2 + 1 + 1) / 4
