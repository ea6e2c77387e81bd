"""Action keys: every input that decides the bytes changes the key; nothing else does."""

from __future__ import annotations

import subprocess
import sys

from kiln.cache.action import action_key, toolchain

BASE = dict(inputs={"input": "ab" * 32}, options={"tile": 32}, machine={"sram": 1}, code="c0de")


def test_key_is_stable_and_covers_every_part():
    key = action_key(**BASE)
    assert key == action_key(**dict(BASE))
    changed = [
        dict(BASE, inputs={"input": "cd" * 32}),
        dict(BASE, options={"tile": 64}),
        dict(BASE, machine={"sram": 2}),
        dict(BASE, code="c0df"),
        dict(BASE, tools=dict(toolchain(), numpy="0.0.1")),
        dict(BASE, extra={"stage": "lir"}),
    ]
    keys = {action_key(**kwargs) for kwargs in changed}
    assert key not in keys and len(keys) == len(changed)


def test_toolchain_names_the_byte_deciding_versions_without_importing_them():
    code = (
        "import sys\n"
        "from kiln.cache.action import toolchain\n"
        "t = toolchain()\n"
        "assert set(t) >= {'kiln', 'python', 'numpy', 'ml_dtypes', 'msgpack'}, t\n"
        "assert 'numpy' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
