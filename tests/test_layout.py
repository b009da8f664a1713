"""The package's layout: four folders in layers, and no private doors between modules.

``prefetch/_torch`` (the workarounds for torch) is the lowest layer and uses
nothing else of the package; ``_shared`` is used by both sides and uses
neither; ``_threads`` (the background threads) uses ``_shared``; ``_device``
(the stream copies) may use both. A module reads another module's private
names only where the two are declared partners or the name is a hook or class
attribute that :class:`LoaderWrapper` declares, and no module outside
``_torch`` uses a private name of torch.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

import prefetch

ROOT = pathlib.Path(prefetch.__file__).parent
LAYERS = {"_torch": 0, "_shared": 1, "_threads": 2, "_device": 3}
"""A folder may import from folders of its own layer or below."""
PARTNERS = {
    ("_shared/checkpointing.py", "_shared/wrapper.py"),
    ("_shared/open_epochs.py", "_shared/epoch.py"),
}
"""(reader, owner): modules that read each other's private names by design."""
HOOKS = {"_idle_epoch", "_start_state", "_copied_to"}
"""Hooks LoaderWrapper declares: any wrapper may call them on the wrapper it wraps."""
ITERATOR_HOOKS = {"_launch", "_sampling_position"}
"""Hooks EpochIterator declares: the wrapper base calls them on the iterators it opens."""
DECLARED = {"_runs_on_consumer_thread"}
"""Class attributes LoaderWrapper declares and a subclass overrides; any wrapper may read them."""

NOT_TORCH = {
    "_fields": "namedtuple's public API",
    "_replace": "namedtuple's public API",
    "_getframe": "sys.\\_getframe, CPython's",
    "_is_gil_enabled": "sys.\\_is_gil_enabled, CPython 3.13's",
    "_is_owned": "threading.Condition's own ownership check, CPython's (Shared.wait_for_data)",
    "_shared_state": "accelerate's AcceleratorState, read to tell whether one exists",
}
"""Private names of others than torch that modules outside _torch read, and whose they are."""
TORCH_MODULE = re.compile(r"^torch(data)?(\.\w+)*\._\w+")
"""A dotted name of a private torch (or torchdata) module: ``torch.utils.data._utils``."""


def modules() -> dict[str, ast.Module]:
    """Every module of the package, by its path relative to the package."""
    return {
        path.relative_to(ROOT).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(ROOT.rglob("*.py"))
    }


def private_names(tree: ast.Module) -> set[str]:
    """The ``_names`` a module defines: functions, classes, attributes it assigns or declares."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def foreign_reads(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, name)`` of each ``x._name`` read where ``x`` is not ``self`` or ``cls``."""
    reads = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and ast.unparse(node.value) not in ("self", "cls")
        ):
            reads.append((node.lineno, node.attr))
    return reads


def own_names(tree: ast.Module) -> set[str]:
    """The ``_names`` a module defines itself, not those it sets on other objects.

    Functions, classes, variables, ``self.``/``cls.`` attributes, ``__slots__``.
    """
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if ast.unparse(node.value) in ("self", "cls"):
                names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__slots__":
            names.update(
                slot.value for slot in ast.walk(node.value) if isinstance(slot, ast.Constant)
            )
    return {name for name in names if isinstance(name, str) and _private(name)}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_"


def _private_module(module: str) -> bool:
    return module.split(".")[0] in ("torch", "torchdata") and any(
        _private(part) for part in module.split(".")
    )


def private_uses(tree: ast.Module, allowed: set[str]) -> list[tuple[int, str]]:
    """``(line, what)`` of each use of a private name the module does not own.

    Found: imports from ``torch.*._*`` modules or of ``_names`` from torch
    modules; strings naming such a module; ``x._name`` (read or written) with
    ``x`` not ``self``/``cls``; a ``"_name"`` string (for ``getattr`` and
    its kin, directly or through a tuple of names). Names in ``allowed`` (the
    module's own, declared hooks, a partner's, others than torch's) are left
    out.
    """
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0] in ("torch", "torchdata")
            names = [alias.name for alias in node.names if _private(alias.name)]
            if _private_module(node.module) or (top and names):
                uses.append((node.lineno, f"from {node.module} import"))
        elif isinstance(node, ast.Import):
            uses += [
                (node.lineno, f"import {a.name}") for a in node.names if _private_module(a.name)
            ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if TORCH_MODULE.match(text) or (
                text.isidentifier() and _private(text) and text not in allowed
            ):
                uses.append((node.lineno, repr(text)))
        elif (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and ast.unparse(node.value) not in ("self", "cls")
            and node.attr not in allowed
        ):
            uses.append((node.lineno, f".{node.attr}"))
    return uses


class TestLayers:
    """Each folder imports only from its own layer or below."""

    def test_no_flat_internal_modules(self) -> None:
        """Internal modules live in _torch, _shared, _threads or _device, not beside __init__."""
        flat = sorted(path.name for path in ROOT.glob("_[a-z]*.py"))
        assert flat == [], f"internal modules belong in a folder: {flat}"
        assert {path.name for path in ROOT.glob("_*") if path.is_dir()} >= set(LAYERS)

    def test_imports_go_down(self) -> None:
        """_torch imports nothing of the package; _shared neither side; _threads not _device."""
        wrong = []
        for name, tree in modules().items():
            folder = name.split("/")[0]
            if folder not in LAYERS:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prefetch."):
                    target = node.module.split(".")[1]  # type: ignore[union-attr]
                    if target in LAYERS and LAYERS[target] > LAYERS[folder]:
                        wrong.append(f"{name}:{node.lineno} imports {node.module}")
        assert wrong == []


def import_graph() -> dict[str, set[str]]:
    """Each module's imports of the package's modules, typing-only imports included."""
    names = {path: "prefetch." + path[: -len(".py")].replace("/", ".") for path in modules()}
    names = {path: name.removesuffix(".__init__") for path, name in names.items()}
    known = set(names.values())
    graph: dict[str, set[str]] = {}
    for path, tree in modules().items():
        targets: set[str] = set()
        for node in ast.walk(tree):  # every import, under `if TYPE_CHECKING:` too
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prefetch"):
                module = node.module or ""
                for alias in node.names:
                    full = f"{module}.{alias.name}"
                    targets.add(full if full in known else module)
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names if alias.name in known}
        graph[names[path]] = targets & known
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each a path from a module back to itself."""
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(graph.get(module, ())):
            if target in path:
                found.append([*path[path.index(target) :], target])
            elif target not in done:
                visit(target, [*path, target])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    return found


class TestNoImportCycles:
    """Imports go one way: no module imports, even for typing only, one that imports it."""

    def test_no_cycles(self) -> None:
        """The package's import graph has no cycle (typing-only imports counted)."""
        assert cycles(import_graph()) == []

    def test_the_check_finds_a_cycle(self) -> None:
        """A planted cycle through three modules is found (the check's control)."""
        graph = import_graph()
        graph["prefetch._threads.tickets"].add("prefetch._threads.engine")
        assert any("prefetch._threads.tickets" in cycle for cycle in cycles(graph))


class TestNoPrivateDoors:
    """No module reads another module's private names, except partners and declared hooks."""

    def test_only_partners_and_hooks(self) -> None:
        """A private name read from another object is this module's own, a hook or a partner's."""
        trees = modules()
        defined = {name: private_names(tree) for name, tree in trees.items()}
        doors = []
        for name, tree in trees.items():
            for line, attr in foreign_reads(tree):
                if attr in defined[name] or attr in HOOKS | ITERATOR_HOOKS or attr in DECLARED:
                    continue
                owners = [other for other, names in defined.items() if attr in names]
                if owners and not any((name, owner) in PARTNERS for owner in owners):
                    doors.append(f"{name}:{line} reads {attr} of {', '.join(owners)}")
        assert doors == []

    @pytest.mark.parametrize("hook", sorted(HOOKS))
    def test_hooks_are_declared_by_the_wrapper_base(self, hook: str) -> None:
        """Every hook named above is a method of LoaderWrapper (so it is declared, not a door)."""
        from prefetch._shared.wrapper import LoaderWrapper

        assert callable(getattr(LoaderWrapper, hook, None))

    @pytest.mark.parametrize("hook", sorted(ITERATOR_HOOKS))
    def test_iterator_hooks_are_declared_by_the_epoch_base(self, hook: str) -> None:
        """Every iterator hook is a method of EpochIterator (so it is declared, not a door)."""
        from prefetch._shared.epoch import EpochIterator

        assert callable(vars(EpochIterator).get(hook))

    @pytest.mark.parametrize("name", sorted(DECLARED))
    def test_declared_attributes_are_on_the_wrapper_base(self, name: str) -> None:
        """Every declared attribute has its default on LoaderWrapper (so it is declared)."""
        from prefetch._shared.wrapper import LoaderWrapper

        assert name in vars(LoaderWrapper)

    def test_the_check_finds_a_door(self) -> None:
        """The check flags a read of another module's private name (its control)."""
        tree = ast.parse("def peek(engine):\n    return engine._work\n")
        engine = private_names(modules()["_threads/engine.py"])
        assert foreign_reads(tree) == [(2, "_work")] and "_work" in engine


class TestArchitecturePage:
    """docs/architecture.rst names what exists, and indexes every module with its tests."""

    PAGE = ROOT.parent / "docs" / "architecture.rst"

    def named(self, pattern: str) -> set[str]:
        """Every ``path`` the page names that matches ``pattern``."""
        return set(re.findall(pattern, self.PAGE.read_text(encoding="utf-8")))

    def test_every_module_is_indexed(self) -> None:
        """Each module of the package (but the folders' __init__) has a row in the index."""
        wanted = {
            f"prefetch/{name}"
            for name in modules()
            if not (name.endswith("/__init__.py") and "/" in name)
        }
        assert wanted - self.named(r"``(prefetch/[\w/]+\.py)``") == set()

    def test_every_path_it_names_exists(self) -> None:
        """Every module and test file the page names is in the repository."""
        paths = self.named(r"``((?:prefetch|tests)/[\w/]+\.py)``")
        missing = sorted(path for path in paths if not (ROOT.parent / path).is_file())
        assert paths and missing == []

    def test_every_dotted_name_it_names_exists(self) -> None:
        """Every ``prefetch._x.y`` module, class or function in its roles resolves."""
        missing = []
        for dotted in self.named(r":(?:mod|class|meth|func):`~?(prefetch\.[\w.]+)`"):
            parts = dotted.split(".")
            target: object = None
            for cut in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
                try:
                    target = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                for part in parts[cut:]:
                    target = getattr(target, part, None)
                break
            if target is None:
                missing.append(dotted)
        assert missing == []


class TestTorchPrivateNames:
    """Only prefetch/_torch uses torch's private names (each use is a checked workaround)."""

    def allowed(self, trees: dict[str, ast.Module], name: str) -> set[str]:
        """What module ``name`` may read: its own names, hooks, its partners', others'."""
        partners = {owner for reader, owner in PARTNERS if reader == name}
        allowed = own_names(trees[name]) | HOOKS | ITERATOR_HOOKS | DECLARED | set(NOT_TORCH)
        for partner in partners:
            allowed |= own_names(trees[partner])
        return allowed

    def test_only_the_torch_folder_uses_them(self) -> None:
        """Outside _torch, no module imports, reads or writes a private name it does not own."""
        trees = modules()
        found = [
            f"{name}:{line} {what}"
            for name, tree in trees.items()
            if not name.startswith("_torch/")
            for line, what in private_uses(tree, self.allowed(trees, name))
        ]
        assert found == []

    def test_the_torch_folder_uses_them(self) -> None:
        """The check sees the uses in _torch (it would not pass by finding nothing anywhere)."""
        trees = modules()
        found = {
            what
            for name, tree in trees.items()
            if name.startswith("_torch/")
            for _, what in private_uses(tree, self.allowed(trees, name))
        }
        assert {"._workers_done_event", "'_num_yielded'", "'_get_iterator'"} <= found
        assert "'torch.utils.data._utils.signal_handling'" in found

    def test_the_check_finds_a_planted_use(self) -> None:
        """Each kind of use, planted in a module, is found (its control)."""
        planted = ast.parse(
            "from torch.utils.data._utils import pin_memory\n"
            "from torch.utils.data.dataloader import _BaseDataLoaderIter\n"
            "import torch._C\n"
            "def peek(it, self):\n"
            "    it._sampler_iter = iter([])\n"
            "    self._mine = 1\n"
            "    return getattr(it, '_num_yielded'), it._workers, self._mine\n"
        )
        assert sorted(private_uses(planted, own_names(planted))) == [
            (1, "from torch.utils.data._utils import"),
            (2, "from torch.utils.data.dataloader import"),
            (3, "import torch._C"),
            (5, "._sampler_iter"),
            (7, "'_num_yielded'"),
            (7, "._workers"),
        ]
