"""Test vectors from megatron-core 0.19.2 (shared/reference/megatron.md §1.5); the oracle
tests (tests/oracle) compare against RankGenerator itself when megatron-core is installed."""

from vime.plan.groups import Layout, orthogonal_groups


def test_tp2_pp2_ep4():
    g = Layout(8, tp=2, cp=1, pp=2, ep=4, etp=1).groups()
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert g["ep"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert g["etp"] == g["edp"] == [[r] for r in range(8)]


def test_masked_orthogonal_vector():
    assert orthogonal_groups([2, 3, 4], [False, True, False]) == [
        [0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11], [12, 14, 16], [13, 15, 17],
        [18, 20, 22], [19, 21, 23]]


def test_ep_spans_tp_ranks():
    g = Layout(8, tp=2, cp=1, pp=1, ep=8, etp=1).groups()
    assert g["dp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert g["ep"] == [list(range(8))]


def test_etp2_ep2():
    g = Layout(8, tp=4, cp=1, pp=1, ep=2, etp=2).groups()
    assert g["dp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert g["etp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["ep"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g["edp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_16_ranks_with_cp_from_a_real_initialize_model_parallel_run():
    layout = Layout(16, tp=2, cp=2, pp=2, ep=4, etp=1)
    g = layout.groups()

    def of(name, rank):
        return next(group for group in g[name] if rank in group)

    assert (of("tp", 0), of("pp", 0), of("cp", 0), of("dp", 0)) == ([0, 1], [0, 8], [0, 2], [0, 4])
    assert (of("ep", 0), of("edp", 0)) == ([0, 1, 2, 3], [0, 4])
    assert (of("cp", 9), of("dp", 9), of("ep", 9), of("edp", 9), of("pp", 9)) == (
        [9, 11], [9, 13], [8, 9, 10, 11], [9, 13], [1, 9])
    for rank in range(16):
        coords = layout.coordinates(rank)
        assert of("tp", rank)[coords["tp"]] == rank and of("ep", rank)[coords["ep"]] == rank


def test_problems_name_megatrons_errors():
    assert Layout(8, 8, 2, 1, 1, 1).problems() == ["world_size (8) is not divisible by 16"]
    assert "expert_tensor_model_pipeline_parallel size (16)" in Layout(8, 1, 1, 1, 16, 1).problems()[0]


def test_the_flat_groups_and_coordinate_columns_equal_the_enumeration():
    # Layout.groups/members and columns build whole lists in C (a plan of 262,144 ranks, issue
    # 17); orthogonal_groups and coordinates are the per-rank reference
    from itertools import product

    for tp, cp, pp, dp, ep, etp in product((1, 2, 3), (1, 2), (1, 2, 3), (1, 2, 4), (1, 2, 4),
                                            (1, 3)):
        layout = Layout(tp * cp * pp * dp, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp)
        if layout.problems():
            continue
        dense = [tp, cp, layout.dp, pp]
        expert = [etp, ep, layout.edp, pp]
        expected = {name: orthogonal_groups(sizes, [i == axis for i in range(4)])
                    for name, sizes, axis in (("tp", dense, 0), ("cp", dense, 1),
                                              ("dp", dense, 2), ("pp", dense, 3),
                                              ("ep", expert, 1), ("etp", expert, 0),
                                              ("edp", expert, 2))}
        assert layout.groups() == expected, layout
        columns = layout.columns()
        assert [{k: columns[k][r] for k in columns} for r in range(layout.world_size)] == [
            layout.coordinates(r) for r in range(layout.world_size)]
