"""Kubernetes resource quantities as the operator reads them from a spec: ``200Gi``, ``1.5T``, ``64G``.

One home for the suffixes (binary ``Ki`` .. ``Ei``, decimal ``k`` .. ``E``) that the tenant policy's storage
ceiling, ``model.storage.claimTemplate.size`` and the engine's memory limit are read with. Unsigned decimal
numbers only, the form the CRDs' patterns admit; :func:`parse_quantity` raises ``ValueError`` for anything
else and each caller says which field it was. (Drift detection compares the API server's canonical forms,
signed and with exponents, in :mod:`kvpilot.operator.inferenceservice.drift`.)
"""

from __future__ import annotations

import re

SUFFIXES = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "Ei": 1 << 60,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")


def parse_quantity_float(quantity: str) -> float:
    """Bytes (or units) of ``quantity``, as a float; ``ValueError`` when it is not a quantity."""
    match = _QUANTITY.match(quantity.strip())
    if match is None:
        raise ValueError(f"{quantity!r} is not a quantity")
    number, suffix = match.groups()
    return float(number) * SUFFIXES[suffix or ""]


def parse_quantity(quantity: str) -> int:
    """Bytes (or units) of ``quantity``, rounded down; ``ValueError`` when it is not a quantity."""
    return int(parse_quantity_float(quantity))
