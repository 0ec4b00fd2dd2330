"""gemsops reaches the device only through gemshal: no device API in its modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import gemshal

GEMSOPS = Path(__file__).resolve().parent.parent / "gemsops"

# Attribute chains and imports that talk to one vendor's runtime directly.
FORBIDDEN_ATTRS = re.compile(
    r"^torch\.(cuda|xpu|npu|mlu|musa|hip|version\.hip|backends\.cuda)\b|^triton\.runtime\.driver\b"
)
FORBIDDEN_IMPORTS = re.compile(r"^(torch_npu|torch_mlu|torch_musa|triton\.runtime\.driver)\b")


def _attr_chain(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    vendor_names = {v.name for v in gemshal.vendors() if not v.is_cpu}
    device_types = {v.device_type for v in gemshal.vendors() if not v.is_cpu}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = _attr_chain(node)
            if chain and FORBIDDEN_ATTRS.match(chain):
                found.append(f"{path.name}:{node.lineno}: {FORBIDDEN_ATTRS.match(chain)[0]}")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names]
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{n}" for n in names)]
            found += [
                f"{path.name}:{node.lineno}: import {n}"
                for n in names
                if FORBIDDEN_IMPORTS.match(n)
            ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            words = set(re.findall(r"[a-z]+", node.value.lower()))
            hits = words & (vendor_names | device_types)
            if hits and node.value.strip() and not _is_docstring(tree, node):
                found.append(f"{path.name}:{node.lineno}: string names {sorted(hits)}")
    return sorted(set(found))


def _is_docstring(tree: ast.AST, const: ast.Constant) -> bool:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and body[0].value is const
        ):
            return True
    return False


def test_gemsops_modules_use_no_device_api() -> None:
    """No gemsops module touches torch.cuda & co, the Triton driver, or names a vendor."""
    files = sorted(GEMSOPS.rglob("*.py"))
    assert len(files) >= 5
    problems = [v for f in files for v in _violations(f)]
    assert problems == []


def test_the_check_catches_a_violation(tmp_path: Path) -> None:
    """The scanner itself flags torch.cuda use, a driver import and a vendor name."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import torch\nfrom triton.runtime import driver\ntorch.cuda.synchronize()\nx = 'nvidia'\n"
    )
    problems = _violations(bad)
    assert len(problems) == 3
