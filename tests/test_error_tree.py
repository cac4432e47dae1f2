"""Errors leave sessionfold through its own tree (``sessionfold.core.errors``), never as a builtin.

A caller catches ``SessionfoldError`` (or one of its branches) and knows it has every error
sessionfold raises on purpose; a ``raise ValueError(...)`` in product code would slip past that.
The tree's classes that stand for a builtin's meaning also subclass it (``InvalidInputError`` is a
``ValueError``, ``MisuseError`` a ``RuntimeError``), so ``except ValueError`` keeps working.

Three kinds of raise sites are not the tree's to own, and are allowed:

- pydantic validators (decorated ``*_validator`` or passed to ``AfterValidator`` and friends):
  pydantic turns their ``ValueError`` into its ``ValidationError``, which the caller's boundary
  explains in the tree's words (``core.pydantic_errors``);
- a module's ``__getattr__`` (PEP 562): Python requires ``AttributeError`` there;
- ``NotImplementedError`` in an abstract method and Alembic's migration scripts (``SystemExit``).
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest
from sessionfold.core import errors

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("core", "store", "runtime", "workers", "client", "service", "cli")
_VALIDATOR_WRAPPERS = {"AfterValidator", "BeforeValidator", "PlainValidator", "WrapValidator"}
_ALLOWED = {"NotImplementedError"}


def _builtin_exception(name: str) -> bool:
    value = getattr(builtins, name, None)
    return isinstance(value, type) and issubclass(value, BaseException)


def _called_name(node: ast.expr) -> str | None:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


def _validators(tree: ast.Module) -> set[str]:
    """Names of the module's functions pydantic calls as validators."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                (_called_name(d) or "").endswith("validator") for d in node.decorator_list):
            names.add(node.name)
        if isinstance(node, ast.Call) and _called_name(node) in _VALIDATOR_WRAPPERS:
            names.update(a.id for a in node.args if isinstance(a, ast.Name))
    return names


def builtin_raises(source: str) -> list[tuple[int, str, str]]:
    """(line, exception, enclosing function) of every builtin exception ``source`` raises
    outside the allowed places."""
    tree = ast.parse(source)
    validators = _validators(tree)
    found: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, function: str, at_module: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child.name, at_module and isinstance(node, ast.Module))
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                name = _called_name(child.exc)
                if (name and _builtin_exception(name) and name not in _ALLOWED
                        and function not in validators
                        and not (function == "__getattr__" and name == "AttributeError"
                                 and at_module)):
                    found.append((child.lineno, name, function))
            visit(child, function, at_module)

    visit(tree, "<module>", True)
    return found


def product_files() -> list[Path]:
    return sorted(p for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py")
                  if "migrations" not in p.relative_to(ROOT).parts)


def test_product_code_raises_only_the_projects_errors() -> None:
    offenders = [f"{path.relative_to(ROOT)}:{line} raises {name} in {function}()"
                 for path in product_files()
                 for line, name, function in builtin_raises(path.read_text())]
    assert not offenders, "raise the matching sessionfold.core.errors class instead:\n" + \
        "\n".join(offenders)


def test_the_scan_sees_what_it_must_refuse_and_what_it_allows() -> None:
    source = '''
from pydantic import AfterValidator, field_validator

def plain(x):
    if x:
        raise ValueError("bad")
    raise RuntimeError

class M:
    @field_validator("a")
    @classmethod
    def _a(cls, v):
        raise ValueError("pydantic explains this one")

    def method(self):
        raise TypeError("not this")

    def later(self):
        raise NotImplementedError

def _strict(v):
    raise ValueError("a validator by wrapper")

T = AfterValidator(_strict)

def __getattr__(name):
    raise AttributeError(name)

def other():
    raise AttributeError("only a module's __getattr__ may")
'''
    assert [(name, fn) for _, name, fn in builtin_raises(source)] == [
        ("ValueError", "plain"), ("RuntimeError", "plain"), ("TypeError", "method"),
        ("AttributeError", "other")]


@pytest.mark.parametrize(("error", "builtin"), [
    (errors.InvalidInputError, ValueError), (errors.MisuseError, RuntimeError),
    (errors.UnsupportedModelError, TypeError), (errors.SessionNotFoundError, LookupError)])
def test_the_tree_keeps_the_builtin_meaning(error: type[Exception],
                                            builtin: type[Exception]) -> None:
    assert issubclass(error, errors.SessionfoldError) and issubclass(error, builtin)


def test_every_class_of_the_tree_is_drawn_in_its_docstring() -> None:
    drawn = errors.__doc__ or ""
    classes = [name for name, value in vars(errors).items()
               if isinstance(value, type) and issubclass(value, errors.SessionfoldError)]
    assert len(classes) > 10
    assert [c for c in classes if c not in drawn] == []
