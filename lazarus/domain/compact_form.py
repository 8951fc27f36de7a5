"""Models written into history without the fields they leave at their defaults.

Some models come by the thousand: a job's node list travels in most activity inputs
and in every continue-as-new, and a preflight answers once per node. At 2,048 nodes,
activity inputs that wrote every field of every node were 82% of a simulated job's
history. A model that derives from :class:`CompactForm` is written as the fields that
differ from their defaults (plus :attr:`CompactForm.always_written`, for people
reading the Web UI); reading it back fills the defaults in, and the full form written
before still reads.

The price: a field's default must keep its meaning across releases, since an
omitted field takes whatever default the reading version has.
"""

from __future__ import annotations

from functools import cache
from typing import Any, ClassVar

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer

_NO_DEFAULT = object()


class CompactForm(BaseModel):
    always_written: ClassVar[frozenset[str]] = frozenset()
    """Fields written even at their default, so that a record still says what it is."""

    @model_serializer(mode="wrap")
    def _without_defaults(self, to_dict: SerializerFunctionWrapHandler) -> dict[str, Any]:
        defaults = _defaults(type(self))
        return {
            key: value
            for key, value in to_dict(self).items()
            if key in self.always_written or value != defaults.get(key, _NO_DEFAULT)
        }


@cache
def _defaults(model: type[BaseModel]) -> dict[str, Any]:
    """Each field's default, as written (a field without one is always written)."""
    return {
        name: field.get_default(call_default_factory=True)
        for name, field in model.model_fields.items()
        if not field.is_required()
    }
