"""``dot`` and ``einsum``, lowered to the matmul/transpose/reshape/sum the backends have.

A two-operand einsum becomes one batched matmul: letters only one operand
has (and the output does not) are summed away first, then each operand is
permuted to (batch, free, contracted) and flattened to 3-D.
"""

from __future__ import annotations

import math
from typing import Any

from kiln.errors import TraceError
from kiln.lang import functions as F
from kiln.lang.tensor import Tensor


def dot(a: Any, b: Any) -> Tensor:
    """``np.dot``: scalars multiply, up to 2-D it is matmul, else a sum over
    the last axis of ``a`` and the second-to-last of ``b``."""
    a, b = F.as_tensor(a, "dot"), F.as_tensor(b, "dot")
    if a.ndim == 0 or b.ndim == 0:
        return F.multiply(a, b)
    if b.ndim <= 2:
        return F.matmul(a, b)
    k = b.shape[-2]
    if a.shape[-1] != k:
        raise TraceError(
            f"dot: shapes {a.shape} and {b.shape} are not aligned ({a.shape[-1]} != {k})"
        )
    rest = b.shape[:-2] + b.shape[-1:]
    b2 = F.reshape(F.transpose(b, (b.ndim - 2, *range(b.ndim - 2), b.ndim - 1)), (k, -1))
    out = F.matmul(F.reshape(a, (-1, k)), b2)
    return F.reshape(out, a.shape[:-1] + rest)


def _parse(spec: str, count: int) -> tuple[list[str], str]:
    if not isinstance(spec, str):
        raise TraceError(f"einsum: the subscripts must be a string, got {spec!r}")
    text = spec.replace(" ", "")
    if "." in text:
        raise TraceError("einsum: '...' is not supported; name every axis")
    lhs, arrow, out = text.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != count or count not in (1, 2):
        raise TraceError(
            f"einsum: {spec!r} names {len(inputs)} operands, {count} given "
            "(one or two operands are supported)"
        )
    letters = "".join(inputs)
    if not arrow:
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    for term in (*inputs, out):
        if not (term.isalpha() or term == "") or len(set(term)) != len(term):
            raise TraceError(
                f"einsum: bad subscripts {term!r} in {spec!r}",
                hint="letters only, each at most once per operand (no diagonals)",
            )
    if set(out) - set(letters):
        raise TraceError(f"einsum: output letters {sorted(set(out) - set(letters))} are not inputs")
    return inputs, out


def einsum(subscripts: str, *operands: Any) -> Tensor:
    """``np.einsum`` for one or two operands without ``...`` or repeated letters."""
    inputs, out = _parse(subscripts, len(operands))
    tensors = [F.as_tensor(t, "einsum") for t in operands]
    sizes: dict[str, int] = {}
    for term, t in zip(inputs, tensors, strict=True):
        if len(term) != t.ndim:
            raise TraceError(
                f"einsum: {term!r} names {len(term)} axes, the operand has shape {t.shape}"
            )
        for c, d in zip(term, t.shape, strict=True):
            if sizes.setdefault(c, d) != d:
                raise TraceError(
                    f"einsum: letter {c!r} is {sizes[c]} in one place and {d} in another"
                )
    keep = set(out) | (set(inputs[0]) & set(inputs[-1]) if len(inputs) == 2 else set(out))
    terms = []
    for term, t in zip(inputs, tensors, strict=True):  # sum letters no one else needs
        gone = [i for i, c in enumerate(term) if c not in keep]
        if gone:
            t = F.sum(t, tuple(gone))
            term = "".join(c for c in term if c in keep)
        terms.append((term, t))
    if len(terms) == 1:
        term, t = terms[0]
        return F.transpose(t, tuple(term.index(c) for c in out)) if out else t
    (ta, a), (tb, b) = terms
    batch = [c for c in out if c in ta and c in tb]
    contract = [c for c in ta if c in tb and c not in out]
    free_a = [c for c in ta if c not in tb]
    free_b = [c for c in tb if c not in ta]

    def arrange(term: str, t: Tensor, groups: list[list[str]]) -> Tensor:
        order = [c for g in groups for c in g]
        t = F.transpose(t, tuple(term.index(c) for c in order))
        return F.reshape(t, tuple(math.prod(sizes[c] for c in g) for g in groups))

    product = F.matmul(
        arrange(ta, a, [batch, free_a, contract]), arrange(tb, b, [batch, contract, free_b])
    )
    order = batch + free_a + free_b
    result = F.reshape(product, tuple(sizes[c] for c in order))
    return F.transpose(result, tuple(order.index(c) for c in out))
