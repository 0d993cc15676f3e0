"""The pure MoE rules at their edges (spec/moe.md MOE-2..MOE-8; scout/core/moe.py).

``tests/replay/test_moe_core.py`` shows each rule on one example; these tests pin the edges
(the least accepted value, the first refused one, bools that are not ints), every field of what
the catalog decides (regimes, representatives, the cover of each ``n_exec``, the digest text a
person reads) and every branch of a template's qualification, so that a one-line change to a
rule fails here. Mutation target ``core-moe`` (tests/mutation/)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scout.core.moe import (
    CatalogEnvironmentError,
    ExecRecord,
    Fingerprint,
    LayerCatalog,
    Regime,
    RegimeCatalog,
    Template,
    balanced_traffic,
    build_layer_catalog,
    covers,
    expert_rows,
    materialize_rows,
    qualify_template,
    validate_counts,
)

ENVIRONMENT = {"torch": "2.13.0", "device": "cpu:cpu", "dtype": "torch.float32", "model": "toy"}


def _error(call: Any, *args: Any) -> str:
    with pytest.raises(ValueError) as error:
        call(*args)
    return str(error.value)


def test_MOE_3_counts_are_as_many_ints_at_least_zero_as_experts_summing_to_the_rows() -> None:
    assert validate_counts([0, 3, 0], 3, 3) == (0, 3, 0)
    assert validate_counts((), 0, 0) == ()
    assert _error(validate_counts, [1, 2], 3, 3) == "2 per-expert counts for 3 local experts: [1, 2]"
    for bad in ([True, 1], [1.0, 1], [-1, 3], ["1", 1]):
        assert _error(validate_counts, bad, 2, 2) == f"per-expert counts must be ints >= 0, got {bad!r}"
    assert _error(validate_counts, [1, 2], 4, 2) == (
        "per-expert counts [1, 2] sum to 3, but the packed input has 4 rows")


def test_MOE_2_expert_rows_are_the_experts_slice_or_the_whole_input_for_an_empty_expert() -> None:
    counts = [2, 0, 5]
    assert [expert_rows(counts, e) for e in range(3)] == [(0, 2), (0, 7), (2, 7)]
    assert expert_rows([0, 4], 0) == (0, 4)
    for expert in (-1, 3):
        assert _error(expert_rows, counts, expert) == f"expert {expert} outside 0..2"


def test_MOE_2_materialization_at_its_least_values_and_with_bools_refused() -> None:
    assert materialize_rows(1, 1) == (0,)
    assert materialize_rows(1, 3) == (0, 0, 0)
    assert materialize_rows(5, 5) == (0, 1, 2, 3, 4)
    for n_exec in (0, True, 2.0, "3"):
        assert _error(materialize_rows, 4, n_exec) == f"n_exec must be an int >= 1, got {n_exec!r}"
    for available in (0, True, 2.0, -1):
        assert _error(materialize_rows, available, 2) == (
            f"an expert replay needs at least one source row, got {available!r}")


def test_MOE_4_a_record_is_normalized_by_its_rows_and_loses_its_grid() -> None:
    record = ExecRecord("mm", shapes=((64, 32), (32, 64), (64,)), strides=((32, 1), (64, 1)), dtype="f32", tag="mkl",
                        grid=(4, 2), block=(64, 1))
    assert record.normalized(64) == ExecRecord("mm", shapes=(("N", 32), (32, "N"), ("N",)),
                                               strides=((32, 1), ("N", 1)), dtype="f32", tag="mkl", grid=(),
                                               block=(64, 1))
    assert record.normalized(7) == ExecRecord("mm", record.shapes, record.strides, "f32", "mkl", (), (64, 1))
    assert Fingerprint(64, (record, record)).key() == (record.normalized(64),) * 2
    assert not record.has_zero_size()
    assert ExecRecord("mm", shapes=((3, 0),)).has_zero_size()
    assert ExecRecord("mm", shapes=((3, 2), (0,))).has_zero_size()
    assert not ExecRecord("mm").has_zero_size()


def _launch(n: int, grid: tuple[int, ...], name: str = "gemm") -> Fingerprint:
    return Fingerprint(n, (ExecRecord(name, shapes=((n, 8),), block=(128,), grid=grid),))


def test_MOE_5_coverage_needs_both_complete_the_same_key_more_rows_and_no_smaller_grid() -> None:
    big, small = _launch(256, (2, 4)), _launch(128, (1, 4))
    assert covers(big, small) and covers(big, big) and not covers(small, big)
    incomplete = Fingerprint(256, big.records, complete=False)
    assert not covers(incomplete, small) and not covers(big, Fingerprint(128, small.records, complete=False))
    assert not covers(_launch(256, (2, 4), "other"), small)  # another kernel
    assert not covers(_launch(256, (2, 3)), small)  # one grid dimension smaller
    assert not covers(_launch(256, (2, 4, 1)), small)  # the grid has another rank
    assert covers(_launch(256, (1, 4)), small)  # an equal grid covers


def test_MOE_4_MOE_5_the_layer_catalog_whole() -> None:
    incomplete = Fingerprint(32, (ExecRecord("mm", shapes=((32, 8),)),), complete=False, reason="no grid reported")
    prints = [_launch(1024, (8, 1)), _launch(64, (1, 1), "gemv"), incomplete, _launch(256, (2, 1)),
              _launch(128, (1, 1), "gemv"), _launch(512, (1, 2))]
    layer = build_layer_catalog(3, (5, 6), prints)
    gemm = "gemm[Nx8]<128>"
    assert layer == LayerCatalog(
        3, (5, 6), (32, 64, 128, 256, 512, 1024),
        (
            Regime((32,), (32,), "mm[32x8]", exact=True, reason="no grid reported"),
            Regime((64, 128), (128,), "gemv[Nx8]<128>"),
            # 1024's grid (8, 1) is above 256's (2, 1) but not above 512's (1, 2), and 512's is
            # not above 256's: 512 and 1024 are maximal, and 256 is replayed through 1024.
            Regime((256, 512, 1024), (512, 1024), gemm),
        ),
        ((32, 32), (64, 128), (128, 128), (256, 1024), (512, 512), (1024, 1024)),
    )
    assert layer.representatives() == (32, 128, 512, 1024)
    assert [layer.covering(n) for n in (32, 64, 256)] == [32, 128, 1024]
    with pytest.raises(KeyError) as error:
        layer.covering(100)
    assert error.value.args[0] == "n_exec 100 was not profiled for MoE layer 3 (profiled: [32, 64, 128, 256, 512, 1024])"
    assert layer.regimes[2].covering(512) == 512 and layer.regimes[2].covering(256) is None


def test_MOE_5_a_member_below_two_maximal_ones_is_replayed_through_the_smaller() -> None:
    prints = [_launch(64, (1, 1)), _launch(128, (2, 1)), _launch(256, (1, 2)), _launch(512, (3, 1))]
    layer = build_layer_catalog(0, (0,), prints)
    assert layer.regimes == (Regime((64, 128, 256, 512), (256, 512), "gemm[Nx8]<128>"),)
    assert layer.cover == ((64, 256), (128, 512), (256, 256), (512, 512))


def test_MOE_4_only_incomplete_fingerprints_each_keep_an_exact_key() -> None:
    prints = [Fingerprint(8, (), complete=False, reason="nothing ran"), Fingerprint(4, (), complete=False, reason="x")]
    layer = build_layer_catalog(0, (1,), prints)
    assert layer.regimes == (Regime((4,), (4,), "(none)", True, "x"), Regime((8,), (8,), "(none)", True, "nothing ran"))
    assert layer.cover == ((4, 4), (8, 8))


def test_MOE_4_a_regime_digest_names_every_part_of_every_record() -> None:
    records = (ExecRecord("mm", shapes=((16, 8), (8, 4)), dtype="bf16", tag="onednn", block=(128, 1, 1)),
               ExecRecord("add"), ExecRecord("bmm", block=(32,)))
    layer = build_layer_catalog(0, (0,), [Fingerprint(16, records)])
    assert layer.regimes[0].fingerprint == "mm[Nx8;8x4]:bf16/onednn<128x1x1> add bmm<32>"


def test_MOE_4_profiling_nothing_or_a_value_twice_is_an_error_naming_the_layer() -> None:
    assert _error(build_layer_catalog, 2, (0,), []) == "MoE layer 2: no n_exec was profiled; give at least one"
    assert _error(build_layer_catalog, 2, (0,), [_launch(4, (1,)), _launch(4, (1,))]) == (
        "MoE layer 2: n_exec values repeat: [4, 4]")


def _expert(count: int, name: str = "mm") -> tuple[ExecRecord, ...]:
    return (ExecRecord(name, shapes=((count, 8),)), ExecRecord("empty", shapes=((0, 8),)))


def _layer() -> LayerCatalog:
    return build_layer_catalog(0, (0, 1, 2), [_launch(n, (1,)) for n in (2, 4, 8)])


def test_MOE_6_a_per_expert_loop_qualifies_as_a_multiset_less_empty_operations() -> None:
    layer = _layer()
    per_expert = {0: _expert(2), 1: _expert(4), 2: _expert(8)}
    # Backward runs the experts in reverse; the template ran no empty operation, the experts did.
    ran = [ExecRecord("mm", shapes=((4, 8),)), ExecRecord("mm", shapes=((2, 8),)), ExecRecord("zero", shapes=((0,),))]
    assert qualify_template(layer, (2, 4, 0), ran, per_expert) == Template(
        0, (2, 4, 0), True, "decomposes into covered per-expert executions")
    # An expert with no token needs no profile of its own.
    assert qualify_template(layer, [0, 4, 0], [ExecRecord("mm", shapes=((4, 8),))], {1: _expert(4)}).qualified


def test_MOE_6_the_multiset_comparison_and_a_count_of_one() -> None:
    # Counts 2 and 10: records whose natural order (2 < 10) and text order ("10" < "2") differ;
    # either order compares multisets, as long as both sides use the same one.
    layer = build_layer_catalog(0, (0, 1), [_launch(n, (1,)) for n in (1, 2, 10)])
    per_expert = {0: _expert(2), 1: _expert(10)}
    ran = [ExecRecord("mm", shapes=((2, 8),)), ExecRecord("mm", shapes=((10, 8),))]
    assert qualify_template(layer, (2, 10), ran, per_expert).qualified
    assert qualify_template(layer, (2, 10), ran[::-1], per_expert).qualified
    # An expert with one token is an expert with tokens: profiled, and its records expected.
    assert qualify_template(layer, (1, 2), [ExecRecord("mm", shapes=((2, 8),))], {0: _expert(1), 1: _expert(2)}) == (
        Template(0, (1, 2), False, "the call ran 1 record(s) that do not decompose into the experts' own 2: its "
                 "kernels depend on the whole count vector"))
    assert qualify_template(_layer(), (1, 2), [], {0: _expert(1), 1: _expert(2)}) == Template(
        0, (1, 2), False, "counts [1] were not profiled")


def test_MOE_6_every_reason_a_template_is_not_qualified() -> None:
    layer = _layer()
    per_expert = {0: _expert(2), 1: _expert(4)}
    assert qualify_template(layer, (3, 5, 3, 0), [], per_expert) == Template(
        0, (3, 5, 3, 0), False, "counts [3, 5] were not profiled")
    assert qualify_template(layer, (2, 0, 4), [], per_expert) == Template(
        0, (2, 0, 4), False, "expert 2 at 4 rows was not profiled alone")
    assert qualify_template(layer, (2, 4), [ExecRecord("zero", shapes=((0,),))], per_expert) == Template(
        0, (2, 4), False, "the backend reported nothing for the heterogeneous call")
    fused = [ExecRecord("grouped_mm", shapes=((6, 8),))]
    assert qualify_template(layer, (2, 4), fused, per_expert) == Template(
        0, (2, 4), False, "the call ran 1 record(s) that do not decompose into the experts' own 2: its kernels "
        "depend on the whole count vector")
    # One record more than the experts ran is not a decomposition either.
    extra = [*_expert(2)[:1], *_expert(4)[:1], ExecRecord("mm", shapes=((2, 8),))]
    assert not qualify_template(layer, (2, 4), extra, per_expert).qualified


def _catalog(templates: tuple[Template, ...] = ()) -> RegimeCatalog:
    first = build_layer_catalog(0, (0, 1), [_launch(n, (n,)) for n in (2, 4)])
    second = build_layer_catalog(1, (2,), [_launch(4, (1,), "a"), _launch(8, (1,), "b"),
                                           Fingerprint(16, (), complete=False, reason="nothing")])
    return RegimeCatalog(tuple(sorted(ENVIRONMENT.items())), (first, second), templates)


def test_MOE_5_the_catalogs_recipes_labels_and_layers() -> None:
    catalog = _catalog((Template(0, (2, 0), True, "ok"), Template(1, (4, 8), False, "no")))
    assert catalog.expert_keys() == ((0, 4), (1, 4), (2, 4), (2, 8), (2, 16))
    assert catalog.exact_keys() == ((0, 2), (0, 4), (1, 2), (1, 4), (2, 4), (2, 8), (2, 16))
    assert catalog.qualified_templates() == ("layer0:[2, 0]",)
    assert catalog.layer_of(2) is catalog.layers[1] and catalog.layer_of(0) is catalog.layers[0]
    with pytest.raises(KeyError) as error:
        catalog.layer_of(3)
    assert error.value.args[0] == "expert slot 3 is in no MoE layer of this catalog"
    catalog.assert_covers(catalog.exact_keys())


def test_MOE_5_the_coverage_assertion_names_a_key_whose_cover_is_not_in_its_regime() -> None:
    good = _catalog()
    layer = good.layers[1]
    # A tampered cover: n_exec 4 "covered" by 8, which is replayed, but in another regime.
    tampered = RegimeCatalog(good.environment, (good.layers[0], LayerCatalog(
        1, layer.slots, layer.n_exec, layer.regimes, ((4, 8), (8, 8), (16, 16)))))
    assert _error(tampered.assert_covers, [(2, 8), (2, 4)]) == (
        "expert slot 2 at n_exec 4 is not covered by a replayed regime")


def test_MOE_7_a_catalog_is_bound_to_every_part_of_its_environment() -> None:
    for key in ("torch", "device", "dtype", "model"):
        partial = tuple(sorted({**ENVIRONMENT, key: ""}.items()))
        assert _error(RegimeCatalog, partial, ()) == f"a regime catalog is bound to its environment; missing ['{key}']"
    assert _error(RegimeCatalog, (), ()) == (
        "a regime catalog is bound to its environment; missing ['torch', 'device', 'dtype', 'model']")
    layer = _catalog().layers[0]
    assert _error(RegimeCatalog, tuple(ENVIRONMENT.items()), (layer, layer)) == (
        "expert slots repeat across MoE layers: [0, 1, 0, 1]")
    catalog = _catalog()
    catalog.check_environment(dict(ENVIRONMENT, extra="ignored"))
    with pytest.raises(CatalogEnvironmentError) as error:
        catalog.check_environment({**ENVIRONMENT, "torch": "2.14.0", "model": "other"})
    assert str(error.value) == (
        "this MoE regime catalog was built for another environment (model: catalog 'toy', here 'other', torch: "
        "catalog '2.13.0', here '2.14.0'); rebuild it here with `scout moe-catalog`")


def test_MOE_7_the_catalog_json_whole_and_back() -> None:
    catalog = _catalog((Template(0, (2, 0), True, "ok"),))
    data = catalog.to_json()
    assert data == {
        "schema": "scout.moe-catalog/1",
        "environment": ENVIRONMENT,
        "layers": [
            {"layer": 0, "slots": [0, 1], "n_exec": [2, 4], "cover": [[2, 4], [4, 4]],
             "regimes": [{"members": [2, 4], "representatives": [4], "fingerprint": "gemm[Nx8]<128>", "exact": False,
                          "reason": ""}]},
            {"layer": 1, "slots": [2], "n_exec": [4, 8, 16], "cover": [[4, 4], [8, 8], [16, 16]],
             "regimes": [{"members": [4], "representatives": [4], "fingerprint": "a[Nx8]<128>", "exact": False,
                          "reason": ""},
                         {"members": [8], "representatives": [8], "fingerprint": "b[NxN]<128>", "exact": False,
                          "reason": ""},
                         {"members": [16], "representatives": [16], "fingerprint": "(none)", "exact": True,
                          "reason": "nothing"}]},
        ],
        "templates": [{"layer": 0, "counts": [2, 0], "qualified": True, "reason": "ok"}],
        "summary": {"exact_keys": 7, "compressed_keys": 5},
    }
    # n_exec 8 equals the weight dimension 8: both are symbolized ("b[NxN]", MOE-4).
    assert RegimeCatalog.from_json(json.loads(json.dumps(data)), ENVIRONMENT) == catalog
    without_templates = {k: v for k, v in data.items() if k != "templates"}
    assert RegimeCatalog.from_json(without_templates).templates == ()


def test_MOE_7_a_document_that_is_no_catalog_is_refused_saying_what_it_is() -> None:
    assert _error(RegimeCatalog.from_json, ["x"]) == (
        "not a scout.moe-catalog/1 catalog (schema 'list'); rebuild it with `scout moe-catalog`")
    assert _error(RegimeCatalog.from_json, {"schema": "scout.moe-catalog/2"}) == (
        "not a scout.moe-catalog/1 catalog (schema 'scout.moe-catalog/2'); rebuild it with `scout moe-catalog`")
    data = _catalog().to_json()
    del data["layers"][0]["cover"]
    assert _error(RegimeCatalog.from_json, data) == "malformed scout.moe-catalog/1 catalog: KeyError('cover')"
    data = _catalog().to_json()
    data["environment"]["model"] = ""
    assert _error(RegimeCatalog.from_json, data) == (
        "malformed scout.moe-catalog/1 catalog: ValueError(\"a regime catalog is bound to its environment; missing "
        "['model']\")")
    with pytest.raises(CatalogEnvironmentError):
        RegimeCatalog.from_json(_catalog().to_json(), {**ENVIRONMENT, "dtype": "torch.bfloat16"})


def test_MOE_8_the_traffic_matrix_is_balanced_and_needs_a_rank_and_a_row() -> None:
    assert balanced_traffic(1, 1) == ((1,),)
    assert balanced_traffic(3, 2) == ((2, 2, 2), (2, 2, 2), (2, 2, 2))
    for ep_size, rows in ((0, 1), (1, 0), (-1, 5)):
        assert _error(balanced_traffic, ep_size, rows) == (
            f"an all-to-all replay needs ep_size >= 1 and rows_per_pair >= 1, got {ep_size}, {rows}")
