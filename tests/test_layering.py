"""The import layering of DESIGN.md §1, read from the source (no module is imported).

``p2p`` ← ``relay``, ``crdt``, ``contracts`` ← ``runtime`` ← ``nodes/kit`` ←
each daemon of ``nodes/``; ``runtime`` ← ``agents``; both ← ``cli``. The rules
checked here:

- a daemon package (``nodes/<daemon>/``) imports no other part of ``nodes``
  than ``nodes.kit`` and itself: daemons meet over the swarm, through
  ``contracts/``;
- ``nodes/kit`` imports no daemon package (nor ``agents``, ``cli``);
- ``contracts/`` imports only ``p2p``, pydantic, the standard library and itself
  (and msgpack, the wire codec of every message, DESIGN.md §2: a contract that
  defines a wire form encodes and decodes it; no runtime such as trio);
- ``p2p/`` imports nothing of the platform (``nodes``, ``agents``, ``cli``,
  ``contracts``, ``relay``, ``crdt``);
- ``relay/`` and ``crdt/`` import only ``p2p`` of the platform (each sits
  beside ``contracts`` on it);
- ``runtime/`` (what every daemon process shares: process supervision, the
  log shipper) imports only ``p2p`` and ``contracts`` of the platform;
- ``nodes`` and ``agents`` (the daemons in a job's VM) never import each
  other, and neither imports ``cli``: what both need lives in ``runtime``.

Every ``import`` statement counts, including those under ``if TYPE_CHECKING:``
or inside a function: a type-only import still ties one package to another.
"""

from __future__ import annotations

import ast
import hashlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Top-level packages that are the platform (above ``p2p``).
_PLATFORM = frozenset({"nodes", "agents", "cli", "contracts", "runtime", "relay", "crdt"})
#: What ``contracts/`` may import besides the standard library and itself.
_CONTRACTS_MAY_IMPORT = frozenset({"p2p", "pydantic", "pydantic_core", "msgpack"})


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    imported: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: imports {self.imported}: {self.rule}"


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(root: Path, path: Path) -> Iterator[tuple[int, str]]:
    """``(line, dotted name)`` for every import in the file, relative ones resolved.

    ``from a.b import c`` yields ``a.b.c`` (``c`` may be a submodule: the rules
    look at the first two components only, so a name in ``a.b`` is judged as
    ``a.b``'s).
    """
    tree = ast.parse(path.read_bytes(), filename=str(path))
    package = _module_name(root, path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield node.lineno, base if alias.name == "*" else f"{base}.{alias.name}"


def _daemons(root: Path) -> frozenset[str]:
    """The daemon packages: every package directly under ``nodes/`` but the kit."""
    nodes = root / "nodes"
    return frozenset(p.name for p in nodes.iterdir()
                     if (p / "__init__.py").is_file() and p.name != "kit")


def _rule(module: str, imported: str, daemons: frozenset[str]) -> str | None:
    """Why ``module`` may not import ``imported``; None if it may."""
    top, _, rest = imported.partition(".")
    #: The part of ``nodes`` imported ("" for the bare package), else None.
    part = rest.partition(".")[0] if top == "nodes" else None
    layer, _, sub = module.partition(".")
    home = sub.partition(".")[0]
    if layer == "p2p" and top in _PLATFORM:
        return "p2p/ imports nothing of the platform"
    if layer in ("relay", "crdt") and top in _PLATFORM - {layer}:
        return f"{layer}/ imports only p2p of the platform"
    if layer == "runtime" and top in _PLATFORM - {"runtime", "contracts"}:
        return "runtime/ imports only p2p and contracts of the platform"
    if layer == "agents" and top in ("nodes", "cli"):
        return "agents/ imports neither nodes nor cli (shared code lives in runtime/)"
    if layer == "nodes" and top in ("agents", "cli"):
        return "nodes/ imports neither agents nor cli (they sit above it)"
    if (layer == "contracts" and top != "contracts" and top not in _CONTRACTS_MAY_IMPORT
            and top not in sys.stdlib_module_names):
        return "contracts/ imports only p2p, pydantic, msgpack and the standard library"
    if layer == "nodes" and home == "kit" and part not in (None, "", "kit"):
        return "nodes/kit imports no daemon package (it lies below them)"
    if layer == "nodes" and home in daemons and part not in (None, "", "kit", home):
        return (f"nodes/{home} imports only nodes.kit of nodes/ (daemons meet over the "
                "swarm, through contracts/)")
    return None


class ImportsCache:
    """The imports of each file, kept by its path and the SHA-256 of its bytes: a file
    whose bytes are unchanged has the same imports, so only changed files are parsed
    again (parsing the whole tree is ~1 CPU-s). ``known`` is what an earlier run kept;
    ``seen`` is this run's, to keep for the next."""

    def __init__(self, known: dict[str, list] | None = None) -> None:
        self.known = known or {}
        self.seen: dict[str, list] = {}

    def imports(self, root: Path, path: Path) -> list[tuple[int, str]]:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        key = str(path.relative_to(root))
        kept = self.known.get(key)
        if kept is not None and kept[0] == digest:
            found = [(line, name) for line, name in kept[1]]
        else:
            found = list(_imports(root, path))
        self.seen[key] = [digest, found]
        return found


def check_layering(root: Path, cache: ImportsCache | None = None) -> list[Violation]:
    """Every import under ``root`` that breaks a rule of the module doc."""
    cache = cache or ImportsCache()
    daemons = _daemons(root) if (root / "nodes").is_dir() else frozenset()
    found = []
    for top in ("p2p", "contracts", "relay", "crdt", "runtime", "nodes", "agents"):
        for path in sorted((root / top).rglob("*.py")) if (root / top).is_dir() else ():
            module = _module_name(root, path)
            for line, imported in cache.imports(root, path):
                rule = _rule(module, imported, daemons)
                if rule is not None:
                    found.append(Violation(str(path.relative_to(root)), line, imported, rule))
    return found


#: Where pytest's cache keeps the tree's imports between runs (``ImportsCache``).
_CACHE_KEY = "cosmicac/layering-imports"


def test_the_tree_keeps_its_layers(pytestconfig: pytest.Config) -> None:
    store = getattr(pytestconfig, "cache", None)  # None under -p no:cacheprovider
    cache = ImportsCache(store.get(_CACHE_KEY, None) if store is not None else None)
    violations = check_layering(ROOT, cache)
    if store is not None:
        store.set(_CACHE_KEY, cache.seen)
    assert not violations, "\n".join(map(str, violations))


def test_a_changed_file_is_parsed_again_and_an_unchanged_one_is_not(tmp_path: Path) -> None:
    _write(tmp_path, {"p2p/__init__.py": "", "p2p/a.py": "import trio\n"})
    first = ImportsCache()
    assert check_layering(tmp_path, first) == []
    # What a run kept, for an unchanged file, stands for its parse...
    forged = {**first.seen, "p2p/a.py": [first.seen["p2p/a.py"][0], [[1, "cli.main"]]]}
    [kept] = check_layering(tmp_path, ImportsCache(forged))
    assert (kept.path, kept.imported) == ("p2p/a.py", "cli.main")
    # ...and a changed file is read afresh.
    (tmp_path / "p2p" / "a.py").write_text("import trio\nfrom nodes import kit\n")
    [fresh] = check_layering(tmp_path, ImportsCache(forged))
    assert (fresh.line, fresh.imported) == (2, "nodes.kit")


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_tree_that_keeps_its_layers_passes(tmp_path: Path) -> None:
    _write(tmp_path, {
        "p2p/__init__.py": "import os\n",
        "contracts/__init__.py": "",
        "contracts/a.py": "import json\nfrom pydantic import BaseModel\nfrom p2p import rpc\n"
                          "from .b import X\nfrom contracts import b\n",
        "contracts/b.py": "X = 1\n",
        "nodes/__init__.py": "",
        "nodes/kit/__init__.py": "",
        "nodes/kit/client.py": "from contracts.a import X\nimport trio\n"
                               "from p2p.rpc import Method\n",
        "nodes/ork/__init__.py": "",
        "nodes/ork/service.py": "from nodes.kit.client import X\nfrom . import store\n"
                                "from .store import Y\nfrom ..kit import client\n"
                                "import nodes.ork.store\nfrom crdt import db\n"
                                "from relay import r\n",
        "nodes/ork/store.py": "Y = 1\n",
        "nodes/monitor/__init__.py": "",
        "nodes/monitor/service.py": "from nodes import kit\nfrom contracts import a\n",
        "relay/__init__.py": "from p2p import host\nfrom .server import S\n",
        "crdt/__init__.py": "import p2p.keys\nfrom crdt import log\n",
        "agents/__init__.py": "",
        "agents/agent.py": "from runtime.log_shipper import LogShipper\n"
                           "from contracts import a\nfrom crdt import db\nfrom .logs import L\n",
    })
    assert check_layering(tmp_path) == []


def test_each_broken_rule_is_found(tmp_path: Path) -> None:
    _write(tmp_path, {
        "p2p/__init__.py": "",
        "p2p/host.py": "from contracts.model import JobSpec\nimport nodes\n",
        "contracts/__init__.py": "",
        "contracts/a.py": "import trio\nfrom nodes.kit import client\n",
        "nodes/__init__.py": "",
        "nodes/shared.py": "",
        "nodes/kit/__init__.py": "",
        "nodes/kit/client.py": "from nodes.ork.service import OrkService\nimport agents\n"
                               "from ..ork import store\n",
        "nodes/ork/__init__.py": "",
        "nodes/ork/service.py": "from nodes.monitor.service import X\n",
        "nodes/monitor/__init__.py": "",
        "nodes/monitor/service.py": "from ..ork import service\nfrom nodes import ork\n"
                                    "import nodes.shared\n"
                                    "def late():\n    from nodes.ork import client\n",
        "nodes/ork/run.py": "from agents.inference import supervisor\nimport cli.up\n",
        "relay/__init__.py": "from crdt import Database\nfrom nodes.kit import peer\n",
        "crdt/__init__.py": "from contracts import ork\n",
        "agents/__init__.py": "",
        "agents/agent.py": "from nodes.k8s_worker import agents\nfrom cli import up\n"
                           "import nodes.ork.service\nfrom nodes.kit.peer import P\n",
        "runtime/__init__.py": "from nodes.kit import peer\nimport agents\n",
    })
    found = {(v.path, v.line, v.imported) for v in check_layering(tmp_path)}
    assert found == {
        ("p2p/host.py", 1, "contracts.model.JobSpec"),
        ("p2p/host.py", 2, "nodes"),
        ("contracts/a.py", 1, "trio"),
        ("contracts/a.py", 2, "nodes.kit.client"),
        ("nodes/kit/client.py", 1, "nodes.ork.service.OrkService"),
        ("nodes/kit/client.py", 2, "agents"),
        ("nodes/kit/client.py", 3, "nodes.ork.store"),
        ("nodes/ork/service.py", 1, "nodes.monitor.service.X"),
        ("nodes/monitor/service.py", 1, "nodes.ork.service"),
        ("nodes/monitor/service.py", 2, "nodes.ork"),
        ("nodes/monitor/service.py", 3, "nodes.shared"),
        ("nodes/monitor/service.py", 5, "nodes.ork.client"),
        ("nodes/ork/run.py", 1, "agents.inference.supervisor"),
        ("nodes/ork/run.py", 2, "cli.up"),
        ("relay/__init__.py", 1, "crdt.Database"),
        ("relay/__init__.py", 2, "nodes.kit.peer"),
        ("crdt/__init__.py", 1, "contracts.ork"),
        ("agents/agent.py", 1, "nodes.k8s_worker.agents"),
        ("agents/agent.py", 2, "cli.up"),
        ("agents/agent.py", 3, "nodes.ork.service"),
        ("agents/agent.py", 4, "nodes.kit.peer.P"),
        ("runtime/__init__.py", 1, "nodes.kit.peer"),
        ("runtime/__init__.py", 2, "agents"),
    }


def conftest_imports(root: Path) -> list[str]:
    """``path:line`` of every import from a ``conftest`` module under ``root/tests``.

    A conftest holds fixtures, which pytest finds by itself; code that tests
    share lives in support modules, where a reader looking for it expects it."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        # Parsing is the cost (all of tests/ is ~3 MB): an import of a conftest names
        # it, so a file whose text never says "conftest" imports none.
        if b"conftest" not in path.read_bytes():
            continue
        for line, name in _imports(root, path):
            if "conftest" in name.split("."):
                found.append(f"{path.relative_to(root)}:{line}")
    return found


def test_no_test_imports_a_conftest(tmp_path: Path) -> None:
    assert conftest_imports(ROOT) == []
    _write(tmp_path, {"tests/__init__.py": "", "tests/a/__init__.py": "",
                      "tests/a/conftest.py": "X = 1\n",
                      "tests/a/test_x.py": "from .conftest import X\n",
                      "tests/a/test_y.py": "import tests.a.conftest\n"})
    assert conftest_imports(tmp_path) == ["tests/a/test_x.py:1", "tests/a/test_y.py:1"]
