"""The knob space: which stage options a kernel can vary, and what a candidate sets."""

from kiln.tune.space import default_candidate, knobs_for, settings, space_size
from tests.tune.graphs import MACHINE, traced


def test_contractions_get_tile_knobs_and_elementwise_kernels_do_not():
    gemm = traced("gemm", "kernels.linalg", M=64, K=64, N=64)
    add = traced("vector_add", "kernels.elementwise", N=1024)
    gemm_names = [k.name for k in knobs_for(gemm, MACHINE)]
    add_names = [k.name for k in knobs_for(add, MACHINE)]
    assert gemm_names[:3] == ["visa.tile_m", "visa.tile_n", "visa.tile_k"]
    assert "visa.tile_m" not in add_names
    assert add_names == ["visa.vector_tile", "visa.fusion", "lir.double_buffer", "schedule.policy"]


def test_every_knob_starts_at_the_stage_default():
    gemm = traced("gemm", "kernels.linalg", M=64, K=64, N=64)
    knobs = knobs_for(gemm, MACHINE)
    first = {k.name: k.values[0] for k in knobs}
    assert first["visa.tile_m"] == 0 and first["visa.vector_tile"] == 0
    assert first["visa.fusion"] is True and first["lir.double_buffer"] is True
    assert first["schedule.policy"] == "critical-path"
    assert settings(knobs, default_candidate(knobs)) == {}


def test_settings_name_only_the_knobs_moved_off_their_default():
    add = traced("vector_add", "kernels.elementwise", N=1024)
    knobs = knobs_for(add, MACHINE)
    candidate = (2, 0, 1, 1)
    assert settings(knobs, candidate) == {
        "visa": {"vector_tile": knobs[0].values[2]},
        "lir": {"double_buffer": False},
        "schedule": {"policy": "in-order"},
    }
    assert space_size(knobs) == len(knobs[0].values) * 2 * 2 * 2


def test_vector_tiles_never_exceed_the_machine_sram():
    tiny = {**MACHINE, "sram_bytes": 65536, "vector": {"lanes": 16}}
    add = traced("vector_add", "kernels.elementwise", N=1024)
    vector = next(k for k in knobs_for(add, tiny) if k.option == "vector_tile")
    assert max(vector.values) * 4 * 8 <= 65536
