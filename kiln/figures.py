"""Numbers as people read them in text output; JSON and files keep the full values.

``sim_instructions_per_second: 232558.13950718078`` tells a reader nothing
its first digits do not: text rounds a float to four significant digits
(thousands grouped, no decimals from 10,000 up) and leaves counts exact.
"""

from __future__ import annotations

import math


def figure(value: object) -> str:
    """``value`` for a line of text: a float rounded for reading, anything else as is."""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if not math.isfinite(value) or value == 0.0:
        return str(value) if value != 0.0 else "0"
    size = abs(value)
    if size >= 1e4:
        return f"{value:,.0f}"
    if size >= 1e-3:
        return f"{value:.4g}"
    return f"{value:.3g}"
