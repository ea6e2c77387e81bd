"""Float64 numpy references for convolution forward, backward-data and backward-weight.

Channels-last with (taps..., C/groups, K) filters, written as plain loops over
filter taps, so they share no code with kiln.lang.conv; layout helpers convert
to and from the user-facing layouts.
"""

from __future__ import annotations

import itertools

import numpy as np


def out_sizes(sizes, taps, stride, pads, dilation):
    return tuple(
        (n + lo + hi - d * (k - 1) - 1) // s + 1
        for n, k, s, d, (lo, hi) in zip(sizes, taps, stride, dilation, pads, strict=True)
    )


def _windows(x_shape, w_shape, stride, pads, dilation):
    taps = w_shape[:-2]
    out = out_sizes(x_shape[1:-1], taps, stride, pads, dilation)
    for tap in itertools.product(*(range(k) for k in taps)):
        index = (slice(None),)
        for t, s, d, o in zip(tap, stride, dilation, out, strict=True):
            index += (slice(t * d, t * d + (o - 1) * s + 1, s),)
        yield tap, index + (slice(None),), out


def _groups(c, k, groups):
    cg, kg = c // groups, k // groups
    for g in range(groups):
        yield slice(g * cg, (g + 1) * cg), slice(g * kg, (g + 1) * kg)


def forward(x, w, stride, pads, dilation, groups):
    x, w = x.astype(np.float64), w.astype(np.float64)
    xp = np.pad(x, [(0, 0), *pads, (0, 0)])
    out = None
    for tap, index, sizes in _windows(xp.shape, w.shape, stride, ((0, 0),) * len(pads), dilation):
        if out is None:
            out = np.zeros((x.shape[0], *sizes, w.shape[-1]))
        for cs, ks in _groups(x.shape[-1], w.shape[-1], groups):
            out[..., ks] += xp[index][..., cs] @ w[tap][:, ks]
    return out


def dgrad(dy, w, x_shape, stride, pads, dilation, groups):
    dy, w = dy.astype(np.float64), w.astype(np.float64)
    padded = (x_shape[0], *(n + lo + hi for n, (lo, hi) in zip(x_shape[1:-1], pads, strict=True)))
    dxp = np.zeros((*padded, x_shape[-1]))
    zero = ((0, 0),) * len(pads)
    for tap, index, _ in _windows(dxp.shape, w.shape, stride, zero, dilation):
        for cs, ks in _groups(x_shape[-1], w.shape[-1], groups):
            view = dxp[index]
            view[..., cs] += dy[..., ks] @ w[tap][:, ks].T
    crop = (slice(None),) + tuple(
        slice(lo, lo + n) for n, (lo, _) in zip(x_shape[1:-1], pads, strict=True)
    )
    return dxp[crop]


def wgrad(x, dy, w_shape, stride, pads, dilation, groups):
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    xp = np.pad(x, [(0, 0), *pads, (0, 0)])
    dw = np.zeros(w_shape)
    zero = ((0, 0),) * len(pads)
    for tap, index, _ in _windows(xp.shape, w_shape, stride, zero, dilation):
        window = xp[index]
        for cs, ks in _groups(x.shape[-1], w_shape[-1], groups):
            a = window[..., cs].reshape(-1, cs.stop - cs.start)
            b = dy[..., ks].reshape(-1, ks.stop - ks.start)
            dw[tap][:, ks] = a.T @ b
    return dw


def x_to_user(x, last):
    return x if last else np.moveaxis(x, -1, 1)


def x_from_user(x, last):
    return x if last else np.moveaxis(x, 1, -1)


def w_to_user(w, last):
    """(taps..., C/g, K) -> (K, taps..., C/g) or (K, C/g, taps...)."""
    r = w.ndim
    return np.transpose(w, (r - 1, *range(r - 2), r - 2) if last else (r - 1, r - 2, *range(r - 2)))


def w_from_user(w, last):
    r = w.ndim
    return np.transpose(w, (*range(1, r - 1), r - 1, 0) if last else (*range(2, r), 1, 0))
