"""AMQP field values and tables (x-arguments, headers) as the model receives them.

What the wire layer's decoder (pamqp) gives for a field table, spelled here because the model
never imports pamqp or leveret.amqp (pyproject's import-linter contracts): strings (bytes when
not UTF-8), integers, floats, decimals, booleans, timestamps, void, arrays and nested tables.
Types only; no behaviour.
"""

from __future__ import annotations

import datetime
import decimal
from typing import TypeAlias

FieldValue: TypeAlias = (
    bool | int | float | decimal.Decimal | str | bytes | bytearray | datetime.datetime
    | list["FieldValue"] | dict[str, "FieldValue"] | None
)
FieldTable: TypeAlias = dict[str, FieldValue]
