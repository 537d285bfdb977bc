"""A graph's state: a pydantic model whose fields nodes read and write, and the reducers that merge writes.

A field is written by one node at a time unless it declares a reducer, as LangGraph's state does:
``notes: Annotated[list[str], append] = []``. Parallel writers of a field without one are refused when the graph
is built (where the parallelism is certain: a fan-out, a map) and fail the run when it happens anyway (two
conditional edges that both held): never a silent last-writer-wins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from agentfleet.errors import ConfigurationError


@dataclass(frozen=True)
class Reducer:
    """How a field takes a write when it already has a value: ``merge(current, written) -> new``. Named, so a
    graph's picture and its trace say which."""

    name: str
    merge: Callable[[Any, Any], Any]

    def __call__(self, current: Any, written: Any) -> Any:
        return self.merge(current, written)


def _append(current: Any, written: Any) -> Any:
    more = list(written) if isinstance(written, (list, tuple)) else [written]
    return [*(current or []), *more]


def _maximum(current: Any, written: Any) -> Any:
    return written if current is None else max(current, written)


def _minimum(current: Any, written: Any) -> Any:
    return written if current is None else min(current, written)


def _merge(current: Any, written: Any) -> Any:
    return {**(current or {}), **(written or {})}


append = Reducer("append", _append)  # a list field: each write's items after the others'
maximum = Reducer("max", _maximum)
minimum = Reducer("min", _minimum)
merge = Reducer("merge", _merge)  # a dict field: each write's keys over the others'


def reducer(fn: Callable[[Any, Any], Any], name: str | None = None) -> Reducer:
    """A custom reducer from ``fn(current, written) -> new``; it must not depend on the order of parallel
    writes if the graph is to give one answer (writes are applied in node order, then map index)."""
    return Reducer(name or getattr(fn, "__name__", "custom"), fn)


def reducers_of(state: type[BaseModel]) -> dict[str, Reducer]:
    """The reducers a state model declares in its fields' ``Annotated`` metadata."""
    found: dict[str, Reducer] = {}
    for name, field in state.model_fields.items():
        declared = [m for m in field.metadata if isinstance(m, Reducer)]
        if len(declared) > 1:
            raise ConfigurationError(f"state {state.__name__}: field {name!r} declares {len(declared)} reducers; "
                                     "one at most")
        if declared:
            found[name] = declared[0]
    return found


def required_fields(state: type[BaseModel]) -> list[str]:
    return [name for name, field in state.model_fields.items() if field.is_required()]


class WriteConflict(Exception):
    """Two writes of one field in one step, and the field has no reducer."""

    def __init__(self, field: str, writers: Sequence[str]) -> None:
        super().__init__(f"{' and '.join(writers)} wrote {field!r} in the same step and it declares no reducer "
                         "(Annotated[..., append] or another)")
        self.field = field
        self.writers = list(writers)


def apply_writes(state: dict[str, Any], writes: Sequence[tuple[str, Mapping[str, Any]]],
                 reducers: Mapping[str, Reducer]) -> dict[str, Any]:
    """``state`` (JSON-ready values) after one step's ``writes`` ((who, fields) in a fixed order): a field with a
    reducer folds every write in; one without takes its one write, and two are a ``WriteConflict``."""
    out = dict(state)
    plain: dict[str, str] = {}
    for who, fields in writes:
        for name, value in fields.items():
            if name in reducers:
                out[name] = reducers[name](out.get(name), value)
                continue
            if name in plain:
                raise WriteConflict(name, [plain[name], who])
            plain[name] = who
            out[name] = value
    return out


def validated(state: type[BaseModel], values: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The state as the model validates it (JSON-ready), or why it does not."""
    try:
        return state.model_validate(dict(values)).model_dump(mode="json"), None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'state'}: {e['msg']}" for e in exc.errors()[:5])
        return None, problems


def view(state: type[BaseModel], values: Mapping[str, Any], reads: Sequence[str]) -> BaseModel:
    """What a node is handed: the state model holding the fields it reads, and only those; reading another is an
    AttributeError in the node, not a quiet default."""
    shown = state.model_construct(_fields_set=set(reads), **{name: values.get(name) for name in reads})
    for name in state.model_fields:
        if name not in reads:
            shown.__dict__.pop(name, None)  # model_construct filled in its default
    return shown
