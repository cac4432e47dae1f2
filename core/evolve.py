"""A fast copy of a frozen pydantic model with some fields changed: the layers' edit step.

pydantic's ``model_copy(update=...)`` copies generically, then updates; a fold's masking spent a
tenth of its time there. :func:`evolve` builds the same result in one step (nothing validated),
for the package's own models: messages, blocks and window items.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from .errors import InvalidInputError, UnsupportedModelError

__all__ = ["evolve"]


_Model = TypeVar("_Model", bound=BaseModel)
_new = object.__new__
_set = object.__setattr__


def evolve(model: _Model, **changes: Any) -> _Model:
    """``model.model_copy(update=changes)`` for a model of this package: a copy with those
    fields set (and counted as set, so ``to_json`` writes them), nothing validated.

    pydantic's generic path (``__copy__``, then the update) was a tenth of a fold's masking;
    this is the same result built in one step. Only declared fields may change (a key that is
    not one raises ValueError: ``model_copy`` would file it under the extras), and only models
    without private attributes are copied (TypeError: their ``__pydantic_private__`` would
    have to be copied too). ``tests/core/test_messages.py`` compares it with ``model_copy`` on
    every kind of model.
    """
    cls = type(model)
    fields = _EVOLVABLE.get(cls)
    if fields is None:
        fields = _evolvable(cls)
    if not fields.issuperset(changes):
        unknown = sorted(set(changes) - fields)
        raise InvalidInputError(f"{cls.__name__} has no field {unknown[0]!r}")
    copy = _new(cls)
    _set(copy, "__dict__", {**model.__dict__, **changes})
    _set(copy, "__pydantic_fields_set__", model.__pydantic_fields_set__.union(changes))
    extra = model.__pydantic_extra__
    _set(copy, "__pydantic_extra__", None if extra is None else dict(extra))
    _set(copy, "__pydantic_private__", None)
    return copy


#: The fields of each model class :func:`evolve` has copied (checked once per class).
_EVOLVABLE: dict[type[BaseModel], frozenset[str]] = {}


def _evolvable(cls: type[BaseModel]) -> frozenset[str]:
    if cls.__private_attributes__:
        raise UnsupportedModelError(
            f"{cls.__name__} has private attributes; copy it with model_copy")
    fields = _EVOLVABLE[cls] = frozenset(cls.__pydantic_fields__)
    return fields
