"""The connector's counters: every name the package counts under is one Counters knows
(an unknown name raises KeyError where it is counted)."""

from __future__ import annotations

import ast
from pathlib import Path

import kvtier.vllm
from kvtier.vllm.metadata import TIERS, Counters

PACKAGE = Path(kvtier.vllm.__file__).resolve().parent


def counted_names() -> list[tuple[str, int, str | None]]:
    """(file, line, name) of every name COUNTERS.add(name, ...) and
    COUNTERS.add_by_tier(prefix, tiers) count in the package's sources."""
    found = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("add", "add_by_tier")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "COUNTERS"):
                first = node.args[0] if node.args else None
                name = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
                if node.func.attr == "add" or name is None:
                    found.append((path.name, node.lineno, name))
                else:  # add_by_tier(prefix, tiers) counts f"{prefix}_{tier}"
                    found += [(path.name, node.lineno, f"{name}_{tier}") for tier in TIERS]
    return found


def test_every_counted_name_is_a_known_counter():
    found = counted_names()
    assert len(found) > 20, found  # the parse found the package's counting
    unknown = [(f, line, name) for f, line, name in found if name not in Counters.NAMES]
    assert not unknown, f"COUNTERS.add with a name Counters.NAMES lacks (or not a literal): {unknown}"
